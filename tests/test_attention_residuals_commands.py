"""Every reading command with `[model] residual = "attention"` (Attention Residuals, issue 36): trace
(each layer's depth weights with its sources named, text and --json, the gradient, the interventions
that apply and the refusal of those that read a residual stream there is none of, another run
compared), the explore page's answers (the depth mixing in /api/model, the rows it norms), info (one
pseudo-query a layer and the final norm's, the reads' arithmetic counted), export (safetensors
round-trips; GPT-2 and PEFT refuse naming the key; the ONNX window computes what torch does), eval
(and --by-position); torchrun's is tests/test_distributed.py's. The equations themselves are
tests/test_attention_residuals.py's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import SHAKESPEARE, TINY_CONFIG, need, refused, train_tiny_run

import minigpt
import minigpt.explore as explore_package
from minigpt.config import ModelConfig, model_config_from
from minigpt.counts import depth_reads, parameter_counts
from minigpt.errors import MinigptError
from minigpt.explore.explorer import Explorer
from minigpt.inspection.text_format import magnitude
from minigpt.model.flops import forward_counts
from minigpt.model.gpt import MiniGPT

ATTENTION = 'model.residual="attention"'
# float64 and AdamW (tiny.toml's): the same numbers on every machine
TRAIN = ("--set", 'model.dtype="float64"', "--set", "model.n_layer=2", "--steps", "10")
FORMS = {"full": (), "blocks": ("--set", "model.attention_residual_blocks=2")}  # 4 layers: 2 groups of 2
PROMPT = "ROMEO"
STAGES = ["read1", "norm1", "attention", "read2", "norm2", "hidden", "ffn"]  # a block's rows, in order
# what each read weighs: block 0's read1 and read2, block 1's, then the final norm's
SOURCES = {
    "full": [
        ["embedding"],
        ["embedding", "b0.attention"],
        ["embedding", "b0.attention", "b0.ffn"],
        ["embedding", "b0.attention", "b0.ffn", "b1.attention"],
        ["embedding", "b0.attention", "b0.ffn", "b1.attention", "b1.ffn"],
    ],
    "blocks": [
        ["embedding"],
        ["embedding", "partial b0.attention"],
        ["embedding", "b0.attention+b0.ffn"],
        ["embedding", "b0.attention+b0.ffn", "partial b1.attention"],
        ["embedding", "b0.attention+b0.ffn", "b1.attention+b1.ffn"],
    ],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Tiny trained runs (2 blocks, 2 heads of width 8, context 8): Attention Residuals full and in
    2 blocks, and the ordinary residual of the same shape."""
    out = {
        form: train_tiny_run(tmp_path_factory.mktemp(form), *TRAIN, "--set", ATTENTION, *extra)
        for form, extra in FORMS.items()
    }
    out["ordinary"] = train_tiny_run(tmp_path_factory.mktemp("ordinary"), *TRAIN)
    return out


def traced(cli, run, *args) -> dict:
    result = cli("trace", "--run", run, "--prompt", PROMPT, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def reads_of(data: dict) -> list[dict]:
    return [read for block in data["blocks"] for read in block["depth"]] + [data["final_depth"]]


def by_hand(sources: list[list[float]], query: list[float], eps: float) -> tuple[list[float], list[float]]:
    """One read over depth written out: softmax_i(query . v_i / sqrt(mean(v_i^2) + eps)) and the mix."""
    logits = []
    for row in sources:
        scale = 1 / math.sqrt(math.fsum(v * v for v in row) / len(row) + eps)
        logits.append(math.fsum(q * v * scale for q, v in zip(query, row)))
    top = max(logits)
    exps = [math.exp(v - top) for v in logits]
    weights = [e / math.fsum(exps) for e in exps]
    return weights, [math.fsum(w * row[j] for w, row in zip(weights, sources)) for j in range(len(query))]


# ---------------------------------------------------------------------------------------------- trace


@pytest.mark.parametrize("form", list(FORMS))
def test_the_trace_json_names_each_reads_sources_and_its_weights_are_the_softmax_over_them(cli, runs, form):
    """Each layer's depth weights at the traced position, over sources labelled as the model groups
    them, worked out by hand from the trace's own rows and the run's queries: the labels are the rows."""
    data = traced(cli, runs[form])
    model = minigpt.load(runs[form]).model
    assert data["model"]["residual"] == "attention"
    assert [list(block["stages"]) for block in data["blocks"]] == [STAGES, STAGES]
    assert data["blocks"][1]["input"] is None  # no one row enters block 1: each sublayer reads its own mix
    reads = reads_of(data)
    assert [read["sources"] for read in reads] == SOURCES[form]
    assert [read["reader"] for read in reads] == ["b0.attention", "b0.ffn", "b1.attention", "b1.ffn", "final_norm"]
    assert [read["layer"] for read in reads] == [1, 2, 3, 4, 5]
    # the rows each label names: the embedding (block 0's input) and the sublayers' outputs
    rows = {"embedding": data["blocks"][0]["input"]["row"]}
    for i, block in enumerate(data["blocks"]):
        rows[f"b{i}.attention"], rows[f"b{i}.ffn"] = block["stages"]["attention"], block["stages"]["ffn"]
    queries = ["blocks.0.depth1", "blocks.0.depth2", "blocks.1.depth1", "blocks.1.depth2", "final_depth"]
    mixes = [block["stages"][name] for block in data["blocks"] for name in ("read1", "read2")]
    mixes.append(data["final_read"]["row"])
    for read, query, mix in zip(reads, queries, mixes):
        sources = [[math.fsum(col) for col in zip(*(rows[name] for name in group))] for group in read["layers"]]
        weights, row = by_hand(sources, model.get_submodule(query).query.tolist(), model.cfg.norm_eps)
        assert read["shape"] == [1, len(PROMPT), len(read["sources"])]
        assert max(abs(a - b) for a, b in zip(read["weights"], weights)) < 1e-12
        assert max(abs(a - b) for a, b in zip(mix, row)) < 1e-12
        assert read["total"] == math.fsum(read["weights"]) and abs(read["total"] - 1) < 1e-12
    assert data["blocks"][0]["depth"][0]["weights"] == [1.0]  # layer 1 has the embedding alone to read
    assert data["blocks"][0]["stages"]["read1"] == data["input"]["row"]


def test_an_ordinary_trace_json_has_no_reads_over_depth(cli, runs):
    data = traced(cli, runs["ordinary"])
    assert "final_depth" not in data and "final_read" not in data
    assert all("depth" not in block for block in data["blocks"]) and data["blocks"][1]["input"] is not None


@pytest.mark.parametrize("form", list(FORMS))
def test_the_text_trace_shows_a_line_a_layer_with_its_sources_weights_and_their_sum(cli, runs, form):
    data = traced(cli, runs[form])
    result = cli("trace", "--run", runs[form], "--prompt", PROMPT)
    assert result.exit_code == 0, result.output
    text = result.stdout
    lines = text.splitlines()
    assert "pre-norm block, Attention Residuals:" in text
    assert "read1 = sum_i a_i v_i, a = softmax_i(depth1.query . v_i / rms(v_i));" in text
    assert "final_read = sum_i a_i v_i, a = softmax_i(final_depth.query . v_i / rms(v_i))" in text
    assert text.count("depth weights at position 4 (softmax over each read's sources, sum 1):") == 3
    flat = " ".join(text.split())
    for read in reads_of(data):
        final = read["reader"] == "final_norm"
        said = "final_norm reads" if final else f"layer {read['layer']} ({read['reader']}) reads"
        weights = ", ".join(f"{s} {w:.4f}" for s, w in zip(read["sources"], read["weights"]))
        assert f"{said} {weights}; sum 1.0000" in flat
    # after the last block: the mix the final norm reads, then the final norm
    after = lines[lines.index("after the last block") + 1 :]
    assert after[0].startswith("  final_read ") and after[2].startswith("  final_norm ")
    assert "logit lens: the final norm's read over depth (final_depth.query)" in flat
    # no block leaves an output row, and nothing enters block 1 but its reads
    block1 = lines[lines.index("block 1 of 2") + 2]
    assert block1.startswith("  read1 ") and "  output " not in text and "residual1" not in text


def test_the_gradient_reaches_the_embedding_through_the_reads_and_names_final_read_the_top(cli, runs):
    data = traced(cli, runs["full"], "--grad")
    gradient = data["gradient"]
    assert gradient["blocks"][1]["stages"].keys() == set(STAGES)  # no gradient row for the depth weights
    assert all(math.isfinite(v) and v > 0 for v in (gradient["input"]["norm"], gradient["final_norm"]["norm"]))
    text = cli("trace", "--run", runs["full"], "--prompt", PROMPT, "--grad").stdout
    flat = " ".join(text.split())
    top, bottom = gradient["final_read"]["norm"], gradient["input"]["norm"]
    assert f"|grad| of final_read {magnitude(top, 4)}, of block 0's input {magnitude(bottom, 4)}" in flat


def test_interventions_on_the_sublayers_change_every_later_read(cli, runs):
    run = runs["full"]
    scaled = traced(cli, run, "--scale", "0.attention=0", "--compare")
    changes = scaled["stages"]
    assert changes[0]["read1"]["change"] == 0 and changes[0]["attention"]["norm_after"] == 0
    assert changes[0]["read2"]["change"] > 0 and changes[1]["read1"]["change"] > 0 and scaled["kl_divergence"] > 0
    # the zeroed output is still a source: its key is zero, its logit 0, and it keeps a share of the weight
    after = scaled["after"]["blocks"][0]["depth"][1]
    assert after["sources"] == ["embedding", "b0.attention"] and after["weights"][1] > 0
    ablated = traced(cli, run, "--ablate-head", "1.0", "--compare")
    assert ablated["stages"][0]["ffn"]["change"] == 0 and ablated["stages"][1]["attention"]["change"] > 0
    row = ",".join(["0.5"] * 16)
    given = traced(cli, run, "--set-input", row, "--at-position")
    assert given["input"]["replaced"] and given["blocks"][0]["stages"]["read1"] == [0.5] * 16
    every = traced(cli, run, "--all-positions")["all_positions"]
    assert "final_read" in every and "blocks.0.output" not in every and len(every["blocks.1.read2"]) == len(PROMPT)
    assert "blocks.0.depth_weights1" not in every  # weights over sources, not rows
    one = traced(cli, run, "--block", "1")
    assert [block["index"] for block in one["blocks"]] == [1] and len(one["blocks"][0]["depth"]) == 2


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--replace-residual", "0", "--replace-residual: this model has no residual stream"),
        ("--broadcast-update", "0.attention", "--broadcast-update: this model has no residual add"),
    ],
)
def test_what_reads_a_residual_stream_is_refused_saying_there_is_none(cli, runs, flag, value, said):
    stderr = refused(cli, "trace", "--run", runs["full"], "--prompt", PROMPT, flag, value)
    assert said in stderr and '([model] residual = "attention")' in stderr


def test_a_patch_of_a_later_blocks_input_is_refused_there_being_none(runs):
    run = minigpt.load(runs["full"])
    patch = {"clean": "ROMAN", "block": 1, "stage": "input", "position": None, "head": None}
    with pytest.raises(MinigptError, match="block 1 of this model has no input row"):
        run.trace(PROMPT, patch=patch)
    traced = run.trace(PROMPT, patch={**patch, "block": 0}, compare=False)  # block 0's input: the embedding
    assert traced.blocks[0].input.row == run.trace("ROMAN", compare=False).blocks[0].input.row


def test_runs_are_compared_where_both_read_over_depth_and_refused_beside_a_residual_stream(cli, runs):
    itself = traced(cli, runs["full"], "--compare-run", runs["full"])
    assert itself["kl_divergence"] == 0 and all(c["change"] == 0 for block in itself["stages"] for c in block.values())
    # full beside block form: the same parameters, grouped otherwise, each pass with its own sources
    forms = traced(cli, runs["blocks"], "--compare-run", runs["full"])
    assert reads_of(forms["before"])[2]["sources"] == SOURCES["full"][2]
    assert reads_of(forms["after"])[2]["sources"] == SOURCES["blocks"][2]
    text = cli("trace", "--run", runs["blocks"], "--prompt", PROMPT, "--compare-run", runs["full"]).stdout
    assert "depth weights before at position 4" in text and "depth weights after at position 4" in text
    for this, other in (("full", "ordinary"), ("ordinary", "full")):
        stderr = refused(cli, "trace", "--run", runs[this], "--prompt", PROMPT, "--compare-run", runs[other])
        assert "residual" in stderr and "'attention'" in stderr and "is not the shape of" in stderr


# ---------------------------------------------------------------------------------------------- explore


def test_the_explore_model_says_where_each_sublayer_mixes_over_depth(runs):
    info = Explorer(minigpt.load(runs["blocks"])).model_info()
    depth = info["depth"]
    assert depth["at"] == ["read1", "read2"] and depth["label"] == "mix over depth"
    assert "Block AttnRes" in depth["about"] and (depth["groups"], depth["per_group"]) == (2, 2)
    assert [r["sources"] for r in depth["readers"]] == SOURCES["blocks"]
    assert info["residual_adds"] == {}  # nothing is added to a stream: the diagram draws no skip
    assert info["refused_replacing"].startswith("replace_residual: this model has no residual stream")
    ordinary = Explorer(minigpt.load(runs["ordinary"])).model_info()
    assert ordinary["depth"] is None and ordinary["refused_replacing"] is None


def test_the_explore_trace_carries_the_depth_weights_and_norms_each_row_there_is(runs):
    explorer = Explorer(minigpt.load(runs["full"]))
    answer = explorer.trace({"prompt": PROMPT, "views": True})
    reads = reads_of(answer)  # what the page draws as a row of bars a layer, a bar a source
    assert [len(read["weights"]) for read in reads] == [1, 2, 3, 4, 5]
    assert all(abs(math.fsum(read["weights"]) - 1) < 1e-12 for read in reads)
    norms = answer["views"]["norms"]["after"]
    assert "input" in norms["blocks"][0] and "input" not in norms["blocks"][1]
    assert norms["blocks"][1].keys() == set(STAGES)
    assert norms["final_read"] == math.sqrt(math.fsum(v * v for v in answer["final_read"]["row"]))
    graded = explorer.trace({"prompt": PROMPT, "grad": True, "scale": ["0.ffn=0.5"]})
    assert graded["after"]["gradient"]["blocks"][1]["input"] is None
    page = Path(explore_package.__file__).with_name("index.html").read_text(encoding="utf-8")
    assert 'id="depth"' in page  # where explore.js draws the bars


# ---------------------------------------------------------------------------------------------- info


@pytest.mark.parametrize("blocks", [0, 1, 2, 4])
def test_the_counts_name_one_query_a_sublayer_and_the_final_norms_and_the_reads_arithmetic(blocks):
    shape = dict(context=5, n_layer=2, n_head=2, n_embd=6, ffn_hidden=10, residual="attention")
    cfg = ModelConfig(**shape, attention_residual_blocks=blocks)
    counts = parameter_counts(cfg, 13)
    assert counts.total == MiniGPT(cfg, 13).num_parameters()
    assert [p.name for p in counts.block][0] == "depth1.query" and "depth2.query" in [p.name for p in counts.block]
    assert [p.name for p in counts.after] == ["final_depth.query", "final_norm", "head"]
    ordinary = parameter_counts(ModelConfig(**{**shape, "residual": True}), 13)
    assert counts.total - ordinary.total == (2 * 2 + 1) * 6  # a [D] query for each of 4 layers and the final norm
    # the sources each of the 5 reads weighs (Eq. 6): the full form l of them, in groups of two fewer
    assert depth_reads(cfg) == {0: [1, 2, 3, 4, 5], 4: [1, 2, 3, 4, 5], 2: [1, 2, 2, 3, 3], 1: [1, 2, 2, 2, 2]}[blocks]
    arithmetic, plain = forward_counts(cfg, 13), forward_counts(ModelConfig(**{**shape, "residual": True}), 13)
    reads = next(p for p in arithmetic.after if p.name == "depth.reads")
    assert arithmetic.count(reads) == 2 * sum(depth_reads(cfg)) * 6  # S·D for the logits and S·D for the mix
    assert arithmetic.total - plain.total == arithmetic.count(reads)


def test_info_names_the_queries_and_counts_the_reads(cli, runs):
    text = cli("info", "--run", runs["full"]).stdout
    flat = " ".join(text.split())
    assert "Attention Residuals (full)" in flat and "the total equals num_parameters()" in flat
    for name, says in (
        ("depth1.query 16 D", "attention's read over depth"),
        ("depth2.query 16 D", "the FFN's read over depth"),
        ("final_depth.query 16 D", "the final norm's read over depth"),
    ):
        assert f"{name} {says}" in flat
    assert "depth.reads 480 30D 5 reads of 15 sources in all, 2D a source" in flat
    assert "(Attention Residuals: 5 reads over depth, each sublayer's and the final norm's, weigh 15 sources" in flat
    info = json.loads(cli("info", "--run", runs["blocks"], "--json").stdout)
    assert info["arithmetic"]["depth_reads"] == {
        "reads": 5,
        "sources": 11,
        "sources_per_read": [1, 2, 2, 3, 3],
        "multiply_adds": 2 * 11 * 16,
    }
    shares = info["parameters"]["shares_of_a_block"]
    assert abs(math.fsum(shares.values()) - 1) < 1e-12 and shares["depth_queries"] > 0
    assert json.loads(cli("info", "--run", runs["ordinary"], "--json").stdout)["arithmetic"]["depth_reads"] is None


# ---------------------------------------------------------------------------------------------- export, eval


@pytest.mark.parametrize("form", list(FORMS))
def test_safetensors_export_carries_the_queries_and_round_trips(cli, runs, form, tmp_path):
    from safetensors.torch import load_file

    result = cli("export", "--run", runs[form], "--format", "safetensors", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model"]["residual"] == "attention"
    assert config["model"]["attention_residual_blocks"] == (2 if form == "blocks" else 0)
    tensors = load_file(tmp_path / "out" / "model.safetensors")
    assert {"blocks.0.depth1.query", "blocks.1.depth2.query", "final_depth.query"} <= tensors.keys()
    model = MiniGPT(model_config_from(config["model"], "config.json"), config["vocab_size"])
    model.load_state_dict(tensors)
    run = minigpt.load(runs[form])
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        assert torch.equal(model.eval()(ids)[0], run.model.eval()(ids)[0])


def test_the_gpt2_folder_export_refuses_attention_residuals_naming_the_key(cli, runs, tmp_path):
    stderr = refused(cli, "export", "--run", runs["full"], "--format", "hf", "--out", tmp_path / "hf")
    assert "--format hf cannot express [model] residual = 'attention'" in stderr and not (tmp_path / "hf").exists()


def test_the_peft_export_of_an_attention_residual_lora_run_is_refused_naming_the_key(cli, runs, tmp_path):
    (tmp_path / "tiny.txt").write_text(SHAKESPEARE.read_text(encoding="utf-8")[:5_000], encoding="utf-8")
    (tmp_path / "tiny.toml").write_text(TINY_CONFIG[TINY_CONFIG.index("[tokenizer]") :], encoding="utf-8")
    tuned = cli("train", "-c", tmp_path / "tiny.toml", "--init-from", runs["full"], "--out", tmp_path / "lora",
                "--set", "train.lora_rank=2", "--steps", "2", "--quiet")  # fmt: skip
    assert tuned.exit_code == 0, tuned.output
    stderr = refused(cli, "export", "--run", tmp_path / "lora", "--format", "peft", "--out", tmp_path / "peft")
    assert "--format peft adapts a GPT-2 folder, which cannot express [model] residual = 'attention'" in stderr


@pytest.mark.parametrize("blocks", [0, 2])
def test_the_onnx_window_scores_an_attention_residual_window_as_torch_does(blocks):
    need("onnxruntime")
    need("onnxscript")
    from minigpt.model.fold import fold_norms
    from minigpt.sampling.onnx_window import WindowRuntime

    torch.manual_seed(0)
    cfg = ModelConfig(context=8, n_layer=2, n_head=2, n_embd=16, ffn_hidden=32, residual="attention",
                      attention_residual_blocks=blocks)  # fmt: skip
    model = MiniGPT(cfg, 40)
    with torch.no_grad():
        for p in model.eval().parameters():
            p.normal_(0.0, 0.4)
    folded = fold_norms(model)
    windows = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        expected = model(windows, last_only=True)[0][:, -1]
        assert torch.allclose(folded(windows, last_only=True)[0][:, -1], expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(WindowRuntime(folded, 2)(windows), expected, rtol=0, atol=1e-4)
    assert (expected - expected.mean()).abs().max() > 0.5  # scores that differ, not a flat row


def test_eval_and_eval_by_position_read_an_attention_residual_run(cli, runs, tmp_path):
    text = tmp_path / "held.txt"
    text.write_text(SHAKESPEARE.read_text(encoding="utf-8")[30_000:32_000], encoding="utf-8")
    result = cli("eval", "--run", runs["blocks"], "--data", text, "--json")
    assert result.exit_code == 0, result.output
    scored = json.loads(result.stdout)
    assert 0 < scored["nats_per_token"] < math.log(65)
    result = cli("eval", "--run", runs["blocks"], "--data", text, "--by-position", "--json")
    assert result.exit_code == 0, result.output
    positions = json.loads(result.stdout)["positions"]
    assert [p["position"] for p in positions] == list(range(8))
    assert all(math.isfinite(p["nats"]) and not p["past_trained_length"] for p in positions)
