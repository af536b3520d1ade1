"""The commands on runs trained with the newer [model] position keys: positions = "sinusoidal", "t5" and
rope on a share of each head (rope_fraction). Each tiny run (2 blocks, 2 heads of width 8, context 8,
float64) is sampled, traced (the JSON's position row and model keys; the attribution's parts sum to the
logit), scored by position past its trained length, counted by info, exported (GPT-2's folder refuses
what it cannot express in one line; rope_fraction with the Llama block exports as Phi-3, and a run
of an imported Llama refuses it in one line), and drawn by the explore page; the keys are
refused where they mean nothing. The formulas themselves are tests/test_positions_more.py's."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from conftest import refused, train_tiny_run
from test_by_position import by_hand

import minigpt
from minigpt.config import ModelConfig
from minigpt.explore.explorer import Explorer, positions_enter
from minigpt.inspection.by_position import window_starts
from minigpt.model.gpt import MiniGPT

TRAIN = ("--set", 'model.dtype="float64"', "--set", "model.n_layer=2", "--steps", "5")
RUNS = {
    "sinusoidal": ['model.positions="sinusoidal"'],
    # 8 buckets up to distance 6: distances 0..3 exact, 4 and 5 logarithmic, 6 on the last bucket
    "t5": ['model.positions="t5"', "model.t5_buckets=8", "model.t5_max_distance=6"],
    "rope_fraction": ['model.positions="rope"', "model.rope_fraction=0.5"],
    "llama_fraction": [
        'model.positions="rope"',
        'model.norm="rmsnorm"',
        'model.activation="swiglu"',
        "model.bias=false",
        "model.rope_fraction=0.5",
    ],
}
LONG = "ROMEO:hello"  # 11 characters: past the runs' context of 8


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    out = {}
    for name, sets in RUNS.items():
        folder = tmp_path_factory.mktemp(name)
        out[name] = train_tiny_run(folder, *TRAIN, *(arg for value in sets for arg in ("--set", value)))
        (folder / "val.txt").write_text((folder / "tiny.txt").read_text(encoding="utf-8")[-400:], encoding="utf-8")
    return out


def traced(cli, run, *args) -> dict:
    result = cli("trace", "--run", run, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("name", ["sinusoidal", "t5", "rope_fraction"])
def test_sample_continues_a_prompt_and_past_the_trained_length_with_extrapolate(cli, runs, name):
    result = cli("sample", "--run", runs[name], "--prompt", "ROMEO", "-n", "4", "--greedy")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ROMEO") and len(result.stdout.rstrip("\n")) >= 9
    long = cli("sample", "--run", runs[name], "--prompt", LONG, "-n", "3", "--greedy", "--extrapolate")
    assert long.exit_code == 0, long.output
    assert long.stdout.startswith(LONG)
    line = refused(cli, "sample", "--run", runs[name], "--prompt", LONG, "-n", "3")
    assert "the prompt has 11 tokens" in line and "--extrapolate" in line


def sinusoid_row(t: int, width: int = 16) -> list[float]:
    """Vaswani et al.: PE[t, 2i] = sin(t / 10000^(2i/C)), PE[t, 2i + 1] = cos(the same)."""
    return [(math.sin if c % 2 == 0 else math.cos)(t / 10000 ** (2 * (c // 2) / width)) for c in range(width)]


def test_the_trace_json_holds_the_sinusoidal_row_of_the_traced_position(cli, runs):
    data = traced(cli, runs["sinusoidal"], "--prompt", "ROMEO", "--position", "3")
    assert data["model"]["positions"] == "sinusoidal" and "rope_fraction" not in data["model"]
    given = data["input"]
    assert given["position_row"] == pytest.approx(sinusoid_row(3), abs=1e-12)
    assert given["position_table_shape"] == [8, 16]
    assert [a + b for a, b in zip(given["token_row"], given["position_row"])] == pytest.approx(given["row"], abs=1e-12)
    past = traced(cli, runs["sinusoidal"], "--prompt", LONG, "--extrapolate")
    assert past["past_trained_length"] and past["input"]["position_table_shape"] == [11, 16]
    assert past["input"]["position_row"] == pytest.approx(sinusoid_row(10), abs=1e-12)
    assert "+ position 3" in cli("trace", "--run", runs["sinusoidal"], "--prompt", "ROMEO", "--position", "3").stdout


def test_the_trace_json_names_the_t5_and_rope_fraction_keys(cli, runs):
    t5 = traced(cli, runs["t5"], "--prompt", "ROMEO")
    assert (t5["model"]["positions"], t5["model"]["t5_buckets"], t5["model"]["t5_max_distance"]) == ("t5", 8, 6)
    assert t5["input"]["position_row"] is None and "rotated_query" not in t5["blocks"][0]
    text = cli("trace", "--run", runs["t5"], "--prompt", "ROMEO").stdout
    assert "+ position" not in text and "t5: a learned bias" in " ".join(text.split())
    rope = traced(cli, runs["rope_fraction"], "--prompt", "ROMEO", "--position", "2")
    assert rope["model"]["rope_fraction"] == 0.5 and rope["blocks"][0]["rotated_shape"] == [1, 2, 5, 8]
    # the last half of each head passes unturned: its rotated rows are W_Q's and W_K's projections as they are
    run = minigpt.load(runs["rope_fraction"])
    for i, block in enumerate(rope["blocks"]):
        qkv = run.model.blocks[i].attention.qkv
        norm1 = torch.tensor(block["stages"]["norm1"], dtype=torch.float64)
        projected = (qkv.weight.detach() @ norm1 + qkv.bias.detach()).tolist()
        for h in range(2):
            query, key = projected[8 * h : 8 * h + 8], projected[16 + 8 * h : 16 + 8 * h + 8]
            assert block["rotated_query"][h][4:] == pytest.approx(query[4:], abs=1e-12)
            assert block["rotated_key"][h][4:] == pytest.approx(key[4:], abs=1e-12)
            assert block["rotated_key"][h][:4] != pytest.approx(key[:4], abs=1e-6)  # position 2: turned


@pytest.mark.parametrize("name", ["sinusoidal", "t5", "rope_fraction"])
def test_the_attribution_parts_sum_to_the_logit(cli, runs, name):
    for extra in ((), ("--versus", "a")):
        data = traced(cli, runs[name], "--prompt", "ROMEO", "--attribute", "e", *extra)
        attribution = data["attribution"]
        names = [part["name"] for part in attribution["parts"]]
        assert names[0] == "token" and ("position" in names) == (name == "sinusoidal")
        assert abs(math.fsum(part["value"] for part in attribution["parts"]) - attribution["total"]) < 1e-12
        assert abs(attribution["error"]) < 1e-12
    logits = minigpt.load(runs[name]).trace("ROMEO", compare=False).stage(None, "logits")
    assert attribution["total"] == pytest.approx(float(logits[attribution["id"]] - logits[attribution["versus_id"]]))


@pytest.mark.parametrize("name", ["sinusoidal", "t5"])
def test_eval_by_position_past_the_trained_length_is_the_hand_computed_loss(cli, runs, name):
    val = runs[name].parent / "val.txt"
    line = refused(cli, "eval", "--run", runs[name], "--data", val, "--by-position", "--length", 12)
    assert "--extrapolate" in line
    result = cli("eval", "--run", runs[name], "--data", val, "--by-position", "--length", 12, "--extrapolate", "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert (got["length"], got["trained_length"], got["extrapolate"]) == (12, 8, True)
    assert [p["past_trained_length"] for p in got["positions"]] == [p >= 8 for p in range(12)]
    run = minigpt.load(runs[name], extrapolate=True)
    ids = run.tokenizer.encode(val.read_text(encoding="utf-8"))
    expected = by_hand(run, ids, 12, window_starts(len(ids), 12))
    assert [p["nats"] for p in got["positions"]] == pytest.approx(expected, abs=1e-9)


def info_parts(cli, run) -> dict:
    result = cli("info", "--run", run, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    return {part["name"]: part for part in data["parameters"]["parts"]}, data


def test_info_counts_the_t5_table_and_no_sinusoidal_parameters(cli, runs):
    parts, data = info_parts(cli, runs["t5"])
    assert parts["relative_bias"]["count"] == 8 * 2 and not parts["relative_bias"]["per_block"]
    assert parts["relative_bias"]["formula"] == "buckets·H"
    model = minigpt.load(runs["t5"]).model
    assert data["parameters"]["total"] == model.num_parameters()
    assert data["arithmetic"]["positions_not_counted"]["scheme"] == "t5"
    parts, data = info_parts(cli, runs["sinusoidal"])
    assert "position_table" not in parts and "relative_bias" not in parts
    assert data["parameters"]["total"] == minigpt.load(runs["sinusoidal"]).model.num_parameters()
    assert data["parameters"]["total"] == model.num_parameters() - 8 * 2  # the same shape less T5's table
    text = " ".join(cli("info", "--run", runs["sinusoidal"]).stdout.split())
    assert "sinusoidal positions (a fixed table; no parameters)" in text
    text = " ".join(cli("info", "--run", runs["t5"]).stdout.split())
    assert "T5 relative positions (8 buckets up to distance 6, shared by every block)" in text


@pytest.mark.parametrize("name", ["sinusoidal", "t5"])
def test_the_gpt2_folder_refuses_sinusoidal_and_t5_in_one_line(cli, runs, name, tmp_path):
    line = refused(cli, "export", "--run", runs[name], "--format", "hf", "--out", tmp_path / "hf")
    scheme = "sinusoidal" if name == "sinusoidal" else "t5"
    assert f"--format hf cannot express [model] positions = '{scheme}': GPT-2 adds a learned position table" in line
    assert not (tmp_path / "hf").exists()


def test_the_llama_block_with_rope_fraction_exports_as_phi3_but_a_run_of_an_imported_llama_refuses_it(
    cli, runs, tmp_path
):
    """Phi-3 is the Llama-family folder whose rope turns a share of each head (partial_rotary_factor);
    a run descending from a Llama import keeps its family, which rotates every coordinate: one line."""
    result = cli("export", "--run", runs["llama_fraction"], "--format", "hf", "--out", tmp_path / "hf")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("phi3", ["Phi3ForCausalLM"])
    assert config["partial_rotary_factor"] == config["rope_parameters"]["partial_rotary_factor"] == 0.5
    imported = shutil.copytree(runs["llama_fraction"], tmp_path / "imported")
    (imported / "origin.json").write_text(json.dumps({"kind": "hf-llama", "path": "tiny-llama"}), encoding="utf-8")
    line = refused(cli, "export", "--run", imported, "--format", "hf", "--out", tmp_path / "llama")
    assert (
        "--format hf cannot express [model] rope_fraction = 0.5: Llama rotates every coordinate of a head; "
        "Phi-3 (partial_rotary_factor) rotates a share of each" in line
    )
    assert not (tmp_path / "llama").exists()


def test_safetensors_export_of_a_t5_run_round_trips(cli, runs, tmp_path):
    from safetensors.torch import load_file

    from minigpt.config import model_config_from

    result = cli("export", "--run", runs["t5"], "--format", "safetensors", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    model = MiniGPT(model_config_from(config["model"], "config.json"), config["vocab_size"])
    model.load_state_dict(load_file(tmp_path / "out" / "model.safetensors"))
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        assert torch.equal(model.eval()(ids)[0], minigpt.load(runs["t5"]).model.eval()(ids)[0])


def test_rope_fraction_is_refused_without_rope_and_where_it_rotates_an_odd_width(cli, tiny_config, tmp_path):
    train = ("train", "-c", tiny_config, "--out", tmp_path / "run", "--steps", "1")
    line = refused(cli, *train, "--set", "model.rope_fraction=0.5")
    assert "rope_fraction = 0.5" in line and 'positions = "learned"' in line
    for fraction, rotated in (("0.375", 3), ("0.125", 1)):  # heads 8 wide: 3 and 1 coordinates
        line = refused(cli, *train, "--set", 'model.positions="rope"', "--set", f"model.rope_fraction={fraction}")
        assert f"rope_fraction = {fraction} rotates {rotated} of each head's 8 coordinates" in line
    assert not (tmp_path / "run").exists()


def test_the_explore_page_says_where_the_new_positions_enter(runs):
    shape = dict(context=4, n_layer=1, n_head=2, n_embd=8, ffn_hidden=8)
    drawn = {
        scheme: positions_enter(MiniGPT(ModelConfig(**shape, **changes), 5).architecture())
        for scheme, changes in {
            "sinusoidal": dict(positions="sinusoidal"),
            "t5": dict(positions="t5", t5_max_distance=8),
            "rope_fraction": dict(positions="rope", rope_fraction=0.5),
        }.items()
    }
    assert {scheme: (d["at"], d["label"]) for scheme, d in drawn.items()} == {
        "sinusoidal": ("input", "+ position row"),
        "t5": ("attention", "bias on the scores"),
        "rope_fraction": ("attention", "rotate Q, K"),
    }
    assert "sinusoidal" in drawn["sinusoidal"]["about"] and "not learned" in drawn["sinusoidal"]["about"]
    assert "t5" in drawn["t5"]["about"] and "50%" in drawn["rope_fraction"]["about"]
    for name in ("sinusoidal", "t5"):
        info = Explorer(minigpt.load(runs[name])).model_info()
        assert info["positions"] == name and info["window"] == 8
        crossing = Explorer(minigpt.load(runs[name], extrapolate=True))
        assert crossing.model_info()["window"] is None
        assert len(crossing.step({"prompt": LONG, "greedy": True})["ids"]) == 12
