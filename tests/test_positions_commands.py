"""Every reading command with `[model] positions = "rope"` and `"alibi"` (issue 35): trace (the rotated
query and key rows in --json, where positions enter in the text, the trained length crossed on purpose,
the interventions), attribution and patching (no position part; the parts still sum to the logit),
the explore page's answers (where the diagram draws positions entering; the step past the trained
length), export (safetensors round-trips positions and rope_theta; GPT-2 and PEFT refuse naming the
key; the ONNX window computes what torch does), info (no position parameters; the rotation and the
bias named and not counted); torchrun's is tests/test_distributed.py's. The formulas themselves are
tests/test_positions.py's."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import SHAKESPEARE, TINY_CONFIG, need, train_tiny_run

import minigpt
from minigpt.config import ModelConfig, model_config_from
from minigpt.counts import parameter_counts
from minigpt.explore.explorer import Explorer, positions_enter
from minigpt.model.flops import forward_counts
from minigpt.model.gpt import MiniGPT

SCHEMES = ("rope", "alibi")
# float64 and AdamW: the same numbers on every machine
TRAIN = ("--set", 'model.dtype="float64"', "--set", "model.n_layer=2", "--steps", "10")
LONG = "ROMEO:hello"  # 11 characters: past the tiny runs' context of 8
STAGES = {"norm1", "attention", "residual1", "norm2", "hidden", "ffn", "output"}  # a pre-norm block's rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """A tiny trained run (2 blocks, 2 heads of width 8, context 8) for each of rope and alibi."""
    return {
        scheme: train_tiny_run(tmp_path_factory.mktemp(scheme), *TRAIN, "--set", f'model.positions="{scheme}"')
        for scheme in SCHEMES
    }


def traced(cli, run, *args) -> dict:
    result = cli("trace", "--run", run, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ---------------------------------------------------------------------------------------------- trace


def rotated_by_hand(row: list[float], position: int, theta: float) -> list[float]:
    """One head's row turned by `position`, Hugging Face Llama's half-split layout written out:
    coordinate j pairs with j + d/2 and turns by position x theta^(-2j/d)."""
    half = len(row) // 2
    out = [0.0] * len(row)
    for j in range(half):
        angle = position * theta ** (-2 * j / len(row))
        c, s = math.cos(angle), math.sin(angle)
        out[j] = row[j] * c - row[j + half] * s
        out[j + half] = row[j + half] * c + row[j] * s
    return out


def test_a_rope_trace_json_holds_each_blocks_rotated_query_and_key_rows_of_the_traced_position(cli, runs):
    run = minigpt.load(runs["rope"])
    data = traced(cli, runs["rope"], "--prompt", "ROMEO", "--position", "3")
    assert data["model"]["positions"] == "rope" and data["model"]["rope_theta"] == 10000
    assert data["input"]["position_row"] is None and "past_trained_length" not in data
    heads, width = 2, 8
    for i, block in enumerate(data["blocks"]):
        assert block["rotated_shape"] == [1, heads, 5, width]
        assert set(block["stages"]) == STAGES  # the rotated rows are not rows of the stream
        # Q and K of the traced position from its norm1 row through W_Q and W_K, turned by hand
        qkv = run.model.blocks[i].attention.qkv
        projected = (
            qkv.weight.detach() @ torch.tensor(block["stages"]["norm1"], dtype=torch.float64) + qkv.bias.detach()
        ).tolist()
        for h in range(heads):
            query, key = projected[h * width : (h + 1) * width], projected[16 + h * width : 16 + (h + 1) * width]
            for got, row in ((block["rotated_query"][h], query), (block["rotated_key"][h], key)):
                # the library turns by angles computed in float32, as transformers does
                assert got == pytest.approx(rotated_by_hand(row, 3, 10000.0), abs=1e-5)
    # the API's Trace.stage reads the same rows: [H, d] at the traced position
    trace = run.trace("ROMEO", position=3, compare=False)
    assert trace.stage(1, "rotated_key").tolist() == data["blocks"][1]["rotated_key"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_text_trace_says_where_positions_enter_and_adds_no_position_row(cli, runs, scheme):
    result = cli("trace", "--run", runs[scheme], "--prompt", "ROMEO")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "+ position" not in text and "  token 'O'" in text and "  = input" in text
    said = {
        "rope": "rope: queries and keys turned by their position inside attention (rope_theta\n  10000; the trace's "
        "JSON has the rotated rows)",
        "alibi": "alibi: -slope x distance added to each head's scores inside attention (slopes\n  0.0625, 0.003906)",
    }
    assert said[scheme] in text
    block = traced(cli, runs[scheme], "--prompt", "RO")["blocks"][0]
    assert ({"rotated_query", "rotated_key", "rotated_shape"} <= set(block)) == (scheme == "rope")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_tracing_past_the_trained_length_is_refused_then_said_on_stderr_and_in_the_json(cli, runs, scheme):
    run = runs[scheme]
    refused = cli("trace", "--run", run, "--prompt", LONG)
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1 and "--extrapolate" in refused.stderr
    past = cli("trace", "--run", run, "--prompt", LONG, "--extrapolate", "--json")
    assert past.exit_code == 0, past.output
    assert past.stderr == (
        "minigpt: note: traced past the trained length (--extrapolate): position 10 of 11 tokens, and the model "
        "was trained on at most 8\n"
    )
    data = json.loads(past.stdout)
    assert (data["past_trained_length"], data["trained_length"], data["position"]) == (True, 8, 10)
    # an earlier position of the same text reads no position past the trained length
    inside = cli("trace", "--run", run, "--prompt", LONG, "--extrapolate", "--position", "7", "--json")
    assert inside.exit_code == 0 and inside.stderr == ""
    assert "past_trained_length" not in json.loads(inside.stdout)


def test_a_rope_scaling_says_past_the_trained_length_where_the_position_or_the_dynamic_rule_is(cli, runs):
    def note(*args) -> str:
        result = cli("trace", "--run", runs["rope"], "--prompt", LONG, *args)
        assert result.exit_code == 0, result.output
        return result.stderr

    assert "(rope scaling linear:2): position 10 of 11 tokens" in note("--rope-scaling", "linear:2")
    assert note("--rope-scaling", "linear:2", "--position", "5") == ""  # linear turns position 5 as any text does
    # the dynamic rule turns every position by the length of the whole text: position 5 too
    assert "(rope scaling ntk:2): position 5 of 11 tokens" in note("--rope-scaling", "ntk:2", "--position", "5")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_interventions_run_on_rope_and_alibi_models(cli, runs, scheme):
    run = runs[scheme]
    ablated = traced(cli, run, "--prompt", "ROMEO", "--ablate-head", "1.0", "--compare")
    changes = ablated["stages"]
    assert changes[0]["output"]["change"] == 0 and changes[1]["attention"]["change"] > 0
    assert ablated["kl_divergence"] > 0
    scaled = traced(cli, run, "--prompt", "ROMEO", "--scale", "0.ffn=0")
    assert scaled["blocks"][0]["stages"]["ffn"] == [0.0] * 16 and scaled["interventions"] == ["scale 0.ffn=0"]
    row = ",".join(["0.5"] * 16)
    given = traced(cli, run, "--prompt", "ROMEO", "--set-input", row, "--at-position")
    assert given["input"]["replaced"] and given["input"]["row"] == [0.5] * 16
    graded = traced(cli, run, "--prompt", "ROMEO", "--grad")["gradient"]
    assert graded["blocks"][1]["stages"].keys() == STAGES  # no gradient row for the rotated queries and keys
    assert all(math.isfinite(v) and v > 0 for v in (graded["input"]["norm"], graded["final_norm"]["norm"]))
    itself = traced(cli, run, "--prompt", "ROMEO", "--compare-run", run)  # another run of this shape: itself
    assert itself["kl_divergence"] == 0 and all(c["change"] == 0 for block in itself["stages"] for c in block.values())
    other = runs["alibi" if scheme == "rope" else "rope"]
    refused = cli("trace", "--run", run, "--prompt", "ROMEO", "--compare-run", other)
    assert refused.exit_code == 2 and "positions '" in refused.stderr
    table = cli("trace", "--run", run, "--prompt", "ROMEO", "--set-row", f"position_table.1={row}")
    assert table.exit_code == 2 and f"no position table ([model] positions = '{scheme}')" in table.stderr


# --------------------------------------------------------------------------------- attribution, patching


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_attribution_has_no_position_part_and_its_parts_sum_to_the_logit(cli, runs, scheme):
    data = traced(cli, runs[scheme], "--prompt", "ROMEO", "--attribute", "e", "--versus", "a")
    attribution = data["attribution"]
    names = [part["name"] for part in attribution["parts"]]
    assert names[0] == "token" and "position" not in names  # positions live inside each head's part
    assert {"0.attention.head0", "0.attention.head1", "1.attention.head1", "1.ffn", "final_norm.bias"} <= set(names)
    logits = minigpt.load(runs[scheme]).trace("ROMEO", compare=False).stage(None, "logits")
    assert attribution["total"] == float(logits[attribution["id"]] - logits[attribution["versus_id"]])
    assert abs(math.fsum(part["value"] for part in attribution["parts"]) - attribution["total"]) < 1e-12
    assert abs(attribution["error"]) < 1e-12


@pytest.mark.parametrize("scheme", SCHEMES)
def test_patching_restores_the_clean_difference_exactly_at_the_last_output(cli, runs, scheme):
    result = cli("patch", "--run", runs[scheme], "--clean", "ROMEO", "--corrupt", "ROMAN", "--answer", "e",
                 "--versus", "a", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    effects = {(e["block"], e["stage"], e["position"]): e["effect"] for e in json.loads(result.stdout)["effects"]}
    assert effects[(1, "output", 4)] == pytest.approx(1.0, abs=1e-9)  # the clean run's last row: its logits
    # the rows of the tokens the two prompts share are the same in both (causal): patching them does nothing
    assert all(effect == 0 for (_, _, p), effect in effects.items() if p < 3)
    # the changed token at position 3 reaches the last position only through attention, where positions live
    assert effects[(0, "input", 3)] != 0


# ---------------------------------------------------------------------------------------------- explore


def test_the_explore_model_says_where_positions_enter_for_each_scheme(runs):
    drawn = {}
    for scheme in ("learned", "none", *SCHEMES):
        model = MiniGPT(ModelConfig(context=4, n_layer=1, n_head=2, n_embd=8, ffn_hidden=8, positions=scheme), 5)
        drawn[scheme] = positions_enter(model.architecture())
    assert {scheme: (d["at"], d["label"]) for scheme, d in drawn.items()} == {
        "learned": ("input", "+ position row"),
        "none": (None, None),
        "rope": ("attention", "rotate Q, K"),
        "alibi": ("attention", "bias on the scores"),
    }
    for scheme in SCHEMES:  # what /api/model answers
        info = Explorer(minigpt.load(runs[scheme])).model_info()
        assert info["positions"] == scheme and info["positions_enter"]["at"] == "attention" and info["window"] == 8
        assert ("rope_theta" in info) == (scheme == "rope")
    assert "the trace JSON has the rotated rows" in drawn["rope"]["about"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_explore_step_and_trace_cross_the_trained_length_only_when_started_with_extrapolate(runs, scheme):
    from minigpt.errors import MinigptError

    plain = Explorer(minigpt.load(runs[scheme]))
    assert len(plain.step({"prompt": "ROMEO:h", "greedy": True})["ids"]) == 8  # fills the trained length
    with pytest.raises(MinigptError, match="the prompt with its next token has 9 tokens .* extrapolate=True"):
        plain.step({"prompt": "ROMEO:he", "greedy": True})
    crossing = Explorer(minigpt.load(runs[scheme], extrapolate=True))
    assert crossing.model_info()["window"] is None
    assert len(crossing.step({"prompt": LONG, "greedy": True})["ids"]) == 12
    answer = crossing.trace({"prompt": LONG, "views": True})
    assert answer["past_trained_length"] and answer["trained_length"] == 8
    assert ("rotated_query" in answer["blocks"][0]) == (scheme == "rope")


# ----------------------------------------------------------------------------------------------- export


@pytest.mark.parametrize("scheme", SCHEMES)
def test_safetensors_export_carries_the_positions_and_round_trips(cli, runs, scheme, tmp_path):
    from safetensors.torch import load_file

    result = cli("export", "--run", runs[scheme], "--format", "safetensors", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model"]["positions"] == scheme and config["model"]["rope_theta"] == 10000
    model = MiniGPT(model_config_from(config["model"], "config.json"), config["vocab_size"])
    model.load_state_dict(load_file(tmp_path / "out" / "model.safetensors"))
    run = minigpt.load(runs[scheme])
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        assert torch.equal(model.eval()(ids)[0], run.model.eval()(ids)[0])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_gpt2_folder_export_refuses_rope_and_alibi_naming_the_key(cli, runs, scheme, tmp_path):
    result = cli("export", "--run", runs[scheme], "--format", "hf", "--out", tmp_path / "hf")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and not (tmp_path / "hf").exists()
    assert f"cannot express [model] positions = '{scheme}': GPT-2 adds a learned position table" in result.stderr


def test_the_peft_export_of_a_rope_lora_run_is_refused_naming_the_key(cli, runs, tmp_path):
    (tmp_path / "tiny.txt").write_text(SHAKESPEARE.read_text(encoding="utf-8")[:5_000], encoding="utf-8")
    (tmp_path / "tiny.toml").write_text(TINY_CONFIG[TINY_CONFIG.index("[tokenizer]") :], encoding="utf-8")
    tuned = cli("train", "-c", tmp_path / "tiny.toml", "--init-from", runs["rope"], "--out", tmp_path / "lora",
                "--set", "train.lora_rank=2", "--steps", "2", "--quiet")  # fmt: skip
    assert tuned.exit_code == 0, tuned.output
    result = cli("export", "--run", tmp_path / "lora", "--format", "peft", "--out", tmp_path / "peft")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "--format peft adapts a GPT-2 folder, which cannot express [model] positions = 'rope'" in result.stderr


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_onnx_window_scores_a_rope_or_alibi_window_as_torch_does(scheme):
    need("onnxruntime")
    need("onnxscript")
    from minigpt.model.fold import fold_norms
    from minigpt.sampling.onnx_window import WindowRuntime

    torch.manual_seed(0)
    model = MiniGPT(ModelConfig(context=8, n_layer=2, n_head=2, n_embd=16, ffn_hidden=32, positions=scheme), 40)
    with torch.no_grad():
        for p in model.eval().parameters():
            p.normal_(0.0, 0.4)
    folded = fold_norms(model)
    windows = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        expected = folded(windows, last_only=True)[0][:, -1]
    torch.testing.assert_close(WindowRuntime(folded, 2)(windows), expected, rtol=0, atol=1e-4)
    assert (expected - expected.mean()).abs().max() > 1.0  # scores that differ, not a flat row


# ------------------------------------------------------------------------------------------------- info


@pytest.mark.parametrize("scheme", SCHEMES)
def test_rope_and_alibi_count_no_position_parameters_and_the_same_arithmetic(scheme):
    shape = dict(context=5, n_layer=3, n_head=2, n_embd=6, ffn_hidden=10)
    counts = parameter_counts(ModelConfig(**shape, positions=scheme), 13)
    learned = parameter_counts(ModelConfig(**shape), 13)
    assert counts.total == MiniGPT(ModelConfig(**shape, positions=scheme), 13).num_parameters()
    assert [p.name for p in counts.before] == ["token_table"] and "context·D" not in str(counts.formula)
    assert learned.total - counts.total == 5 * 6  # the table's context·D, and nothing else
    # the table is looked up, never multiplied; the rotation and the bias are elementwise: not counted
    assert (
        forward_counts(ModelConfig(**shape, positions=scheme), 13).total
        == forward_counts(ModelConfig(**shape), 13).total
    )


@pytest.mark.parametrize("scheme", SCHEMES)
def test_info_names_the_scheme_and_what_it_leaves_uncounted(cli, runs, scheme):
    text = cli("info", "--run", runs[scheme]).stdout
    flat = " ".join(text.split())
    said = {
        "rope": (
            "rotary positions (rope_theta 10000; no parameters)",
            "(rope's rotation of each query and key row, 4D = 64 multiplies and 2D = 32 adds per token and block, "
            "is elementwise: not counted below, as the softmax is not)",
        ),
        "alibi": (
            "ALiBi positions (no parameters)",
            "(ALiBi's bias on each score, H·T = 16 adds per token and block, is elementwise: not counted below, as "
            "the softmax is not)",
        ),
    }
    assert said[scheme][0] in flat and said[scheme][1] in flat
    assert "position_table" not in text and "the total equals num_parameters()" in text
    info = json.loads(cli("info", "--run", runs[scheme], "--json").stdout)
    extra = info["arithmetic"]["positions_not_counted"]
    assert (extra["scheme"], extra["multiplies"], extra["adds"]) == (
        (scheme, 64, 32) if scheme == "rope" else (scheme, 0, 2 * 8)
    )
