"""`minigpt info`: the parameters of every part add up to the model's own count (each part to the
tensors it names), the forward arithmetic per token is the bench's estimate split by part, the
memory estimate's optimizer state is what the optimizer keeps, and a run records what `auto`
chose (with --quiet too). Also training's progress off a terminal: plain lines, no carriage returns."""

from __future__ import annotations

import io
import json
import re

import pytest
import torch
from conftest import need

from minigpt.config import ModelConfig
from minigpt.counts import Formula, block_matrices, parameter_counts
from minigpt.device import BFLOAT16_OVERRIDE, native_bfloat16
from minigpt.memory import training_memory
from minigpt.model.flops import forward_counts, training_flops_per_token
from minigpt.model.gpt import MiniGPT

# Every [model] switch that changes what is counted, each on its own and a few together.
SWITCHES = [
    {},
    {"positions": "none"},
    {"ffn_hidden": 0},
    {"norm": "none"},
    {"norm": "rmsnorm"},
    {"activation": "swiglu"},
    {"bias": False},
    {"tie_embeddings": True},
    {"norm_position": "post"},
    {"norm": "rmsnorm", "activation": "swiglu", "bias": False, "tie_embeddings": True, "positions": "none"},
    {"ffn_hidden": 0, "norm": "none", "bias": False},
]


def small(**switches) -> ModelConfig:
    return ModelConfig(**{"context": 5, "n_layer": 3, "n_head": 2, "n_embd": 6, "ffn_hidden": 10, **switches})


# Which of the model's tensors each part counts (block 0's: every block is the same shape).
TENSORS = {
    "token_table": ["token_table."],
    "position_table": ["position_table."],
    "norm1": ["blocks.0.norm1."],
    "norm2": ["blocks.0.norm2."],
    "ffn.W1": ["blocks.0.ffn.W1."],
    "ffn.W2": ["blocks.0.ffn.W2."],
    "final_norm": ["final_norm."],
    "head": ["head."],
}


def numel(model: MiniGPT, prefixes: list[str]) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if any(name.startswith(x) for x in prefixes))


@pytest.mark.parametrize("switches", SWITCHES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "default")
def test_each_part_counts_the_tensors_it_names_and_the_parts_add_up_to_num_parameters(switches):
    cfg = small(**switches)
    model = MiniGPT(cfg, 13)
    counts = parameter_counts(cfg, 13)
    named = {p.name: counts.count(p) for p in (*counts.before, *counts.block, *counts.after)}
    for part, prefixes in TENSORS.items():
        assert named.get(part, 0) == numel(model, prefixes), part  # the tied head: its tensor is token_table's
    qkv = sum(named[f"attention.{w}"] for w in ("W_Q", "W_K", "W_V"))
    assert qkv == numel(model, ["blocks.0.attention.qkv."])  # W_Q | W_K | W_V stacked in one Linear
    assert named["attention.W_O"] == numel(model, ["blocks.0.attention.out."])
    assert counts.count(counts.block_formula) == numel(model, ["blocks.0."])
    assert counts.total == model.num_parameters()


def test_the_formulas_are_the_textbook_ones_and_gpt2_small_has_its_124_million():
    gpt2 = ModelConfig(context=1024, n_layer=12, n_head=12, n_embd=768, ffn_hidden=3072, tie_embeddings=True)
    counts = parameter_counts(gpt2, 50257)
    assert str(counts.group("attention.")) == "4D² + 4D" and counts.count(counts.group("attention.")) == 2_362_368
    assert str(counts.group("ffn.")) == "2DF + F + D" and counts.count(counts.group("ffn.")) == 4_722_432
    assert str(counts.group("norm")) == "4D"  # LayerNorm: a gain and a bias, twice
    assert counts.total == 124_439_808  # GPT-2 small, as transformers counts it
    swiglu = parameter_counts(small(activation="swiglu", bias=False, norm="rmsnorm"), 13)
    assert str(swiglu.group("ffn.")) == "3DF" and str(swiglu.group("norm")) == "2D"  # RMSNorm: a gain, no bias
    assert str(Formula.of(DD=4, DF=2, F=1, D=9) + Formula.of(TD=2)) == "4D² + 2DF + 2TD + F + 9D"


@pytest.mark.parametrize("switches", SWITCHES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "default")
def test_the_bench_s_flop_estimate_is_six_times_the_sum_of_the_forward_parts(switches):
    cfg = small(**switches)
    model = MiniGPT(cfg, 13)
    # nanoGPT's estimate_mfu written out: 6 x every weight a token multiplies (the head even when it
    # is the token table; the tables' rows are looked up) + 12 x layers x width x context
    tables = model.token_table.weight.numel() + numel(model, ["position_table."])
    multiplied = model.num_parameters() - tables + (13 * 6 if cfg.tie_embeddings else 0)
    nanogpt = 6 * multiplied + 12 * cfg.n_layer * cfg.n_embd * cfg.context
    parts = forward_counts(cfg, 13)
    assert training_flops_per_token(model) == 6 * parts.total == nanogpt
    assert parts.total == sum(parts.count(p) for p in parts.parts())


def test_c21_s_split_16_of_24_width_squared_units_and_the_table_growing_with_t():
    cfg = ModelConfig(context=64, n_layer=2, n_head=4, n_embd=32, ffn_hidden=128)  # F = 4D
    for T in (8, 64):
        a = forward_counts(cfg, 50, T)
        D = cfg.n_embd
        matrices = a.block_formula.only("D²", "DF")
        assert 2 * a.count(matrices) == 24 * D * D  # FLOPs: 2 per multiply-add
        assert 2 * a.count(a.group("ffn.").only("DF")) == 16 * D * D
        table = a.count(a.group("attention.scores") + a.group("attention.weighted_sum"))
        assert 2 * table == 4 * T * D  # Megatron-LM's 4 s h per token: grows with T
    short, long = forward_counts(cfg, 50, 8), forward_counts(cfg, 50, 64)
    assert long.total - short.total == cfg.n_layer * 2 * (64 - 8) * cfg.n_embd


@pytest.mark.parametrize("switches", [{}, {"activation": "swiglu", "bias": False}, {"ffn_hidden": 0}])
def test_muon_s_state_is_one_momentum_per_entry_of_the_matrices_it_trains(switches):
    from minigpt.config import TrainConfig
    from minigpt.training.optimizers import make_optimizer

    cfg = small(**switches)
    model = MiniGPT(cfg, 13)
    muon = make_optimizer(model, TrainConfig(optimizer="muon")).optimizers[0]
    trained_by_muon = sum(p.numel() for group in muon.param_groups for p in group["params"])
    counts = parameter_counts(cfg, 13)
    assert block_matrices(counts) == trained_by_muon
    n, width = model.num_parameters(), 4
    assert training_memory(cfg, 13, 2, "adamw").optimizer_state == 2 * n * width
    assert training_memory(cfg, 13, 2, "muon").optimizer_state == (2 * n - trained_by_muon) * width
    memory = training_memory(cfg, 13, 2, "adamw")
    assert memory.weights == memory.gradients == n * width


# ---------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run trained with --quiet and optimizer = "auto" (the tiny config pins the rest)."""
    from conftest import train_tiny_run

    return train_tiny_run(tmp_path_factory.mktemp("info"), "--set", 'train.optimizer="auto"', "--steps", "4")


def test_info_prints_the_parts_with_their_formulas_and_the_c21_units(cli, trained):
    result = cli("info", "--run", trained)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "  D = 16 (n_embd), F = 32 (ffn_hidden)" in text
    assert re.search(r"\n    attention\.W_Q +272  D² \+ D\n", text)  # 16² + 16
    assert re.search(r"\n    ffn\.W1 +544  DF \+ F\n", text)  # 16 x 32 + 32
    assert re.search(r"\n    attention\.scores +128  TD +Q Kᵀ\n", text)  # T = 8 keys of width 16
    assert "the total equals num_parameters(), the model's own count" in text
    assert re.search(r"FFN W1 and W2 +8  \(4F/D; 16 at F = 4D\)", text)  # F = 2D here: 8 units, not 16
    assert re.search(r"attention table, 4T/D +2  \(grows with T\)", text)  # 4 x 8 / 16


def test_info_json_holds_the_same_numbers_as_the_model_and_the_bench(cli, trained):
    from minigpt.api import load

    info = json.loads(cli("info", "--run", trained, "--json").stdout)
    run = load(trained)
    assert info["parameters"]["total"] == info["parameters"]["num_parameters"] == run.model.num_parameters()
    parts = info["parameters"]["parts"]
    per_block = sum(p["count"] for p in parts if p["per_block"])
    assert per_block == info["parameters"]["block"]["count"]
    assert info["parameters"]["total"] == sum(p["count"] for p in parts if not p["per_block"]) + per_block
    assert info["arithmetic"]["training_flops_per_token"] == training_flops_per_token(run.model)
    assert info["arithmetic"]["forward_flops_per_token"] == 2 * info["arithmetic"]["total"]
    memory = info["memory"]
    assert memory["estimate"] and memory["weights"] == run.model.num_parameters() * 4
    assert memory["total"] == sum(memory[k] for k in ("weights", "gradients", "optimizer_state", "activations"))
    shorter = json.loads(cli("info", "--run", trained, "--json", "--context", "2").stdout)["arithmetic"]
    assert info["arithmetic"]["total"] - shorter["total"] == 2 * (8 - 2) * 16  # two T·D terms, one block


@pytest.fixture(scope="module", params=["native", "emulated"])
def trained_by_auto(request, tmp_path_factory):
    """(the CPU kind the detector was told, a tiny run trained with --quiet and every choice left to
    `auto`): one run with bfloat16 native, one with it emulated, whatever this CPU is."""
    from conftest import train_tiny_run

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(BFLOAT16_OVERRIDE, request.param)
        auto = ["--set", 'train.optimizer="auto"', "--set", 'train.precision="auto"', "--steps", "4"]
        return request.param, train_tiny_run(tmp_path_factory.mktemp(f"info-{request.param}"), *auto)


def test_a_run_trained_with_quiet_records_what_auto_chose_and_info_shows_it(cli, trained_by_auto, monkeypatch):
    kind, run = trained_by_auto
    monkeypatch.setenv(BFLOAT16_OVERRIDE, kind)
    precision = "bfloat16" if native_bfloat16("cpu") else "float32"  # the detector's own answer
    assert precision == {"native": "bfloat16", "emulated": "float32"}[kind]
    payload = torch.load(run / "checkpoint.pt", weights_only=True)
    choices = payload["choices"]
    # The tiny model's Muon orthogonalisation costs far more than its 32-token steps: auto takes AdamW.
    assert choices == {"optimizer": "adamw", "precision": precision, "threads": 1, "device": "cpu"}
    text = cli("info", "--run", run).stdout
    assert "Training chose (its checkpoint at step 4; the config's ask in brackets)" in text
    assert f"  optimizer adamw ('auto'), precision {precision} ('auto')," in text
    assert "  1 thread (1), device cpu ('cpu')" in text
    assert "optimizer adamw (recorded)" in text


@pytest.mark.parametrize(
    "asked, kind, said",
    [("float32", "native", "float32"), ("auto", "native", "bfloat16"), ("auto", "emulated", "float32")],
)
def test_the_summary_line_says_what_the_optimizer_precision_and_threads_came_to(
    cli, tiny_config, tmp_path, monkeypatch, asked, kind, said
):
    monkeypatch.setenv(BFLOAT16_OVERRIDE, kind)
    precision = ["--set", f'train.precision="{asked}"']
    result = cli("train", "-c", tiny_config, "--out", tmp_path / "run", "--steps", "2", *precision)
    assert result.exit_code == 0, result.output
    assert re.search(rf"steps 0->2 on cpu \(adamw, {said} matmuls, 1 thread\), about", result.stderr)


def test_an_import_has_no_recorded_choices_and_is_counted_as_transformers_counts_it(cli, tmp_path):
    need("transformers")
    from test_convert import EOT, TEXT, gpt2_folder, gpt2_model, train_tokenizer
    from tokenizers import AddedToken

    tok = train_tokenizer("bpe", 299, TEXT)
    tok.add_special_tokens([AddedToken(EOT, special=True)])
    hf = gpt2_model()
    folder = gpt2_folder(tmp_path / "gpt2", hf, tok)
    run = tmp_path / "run"
    assert cli("import", "hf", folder, "--out", run).exit_code == 0
    result = cli("info", "--run", run)
    assert result.exit_code == 0, result.output
    assert "Training's choices: none recorded in its checkpoint (an import" in result.stdout
    assert "head tied to token_table" in result.stdout and re.search(r"\n  head +0  0 +tied", result.stdout)
    info = json.loads(cli("info", "--run", run, "--json").stdout)
    assert info["parameters"]["total"] == hf.num_parameters()  # transformers' own count (tied head once)


def test_a_lora_run_s_memory_counts_its_adapters_as_what_trains(cli, trained, tmp_path):
    from minigpt.memory import lora_parameter_count

    run = tmp_path / "lora"
    args = ["--init-from", trained, "--out", run, "--steps", "2", "--set", "train.lora_rank=2", "--quiet"]
    assert cli("train", "-c", trained / "config.toml", *args).exit_code == 0
    info = json.loads(cli("info", "--run", run, "--json").stdout)
    base = load_config_model(trained)
    adapters = lora_parameter_count(base, 2, "qkv,out,W1,W2")
    memory = info["memory"]
    assert memory["lora"] == {"rank": 2, "targets": "qkv,out,W1,W2"} and memory["optimizer"] == "adamw"
    assert memory["gradients"] == adapters * 4 and memory["optimizer_state"] == 2 * adapters * 4
    assert memory["weights"] == (info["parameters"]["total"] + adapters) * 4  # the frozen model and the adapters
    assert f"the {adapters:,} parameters of the rank-2 LoRA adapters" in cli("info", "--run", run).stdout


def load_config_model(run):
    from minigpt.config import load_config

    return load_config(run / "config.toml").model


def test_info_refusals_are_one_line(cli, trained, tmp_path):
    for args, words in [
        (["--run", tmp_path / "none"], "no such run folder"),
        (["--run", trained, "--context", "9"], "--context 9 is not a length this model reads: it reads 1 to 8"),
        (["--run", trained, "--context", "0"], "--context 0 is not a length"),
    ]:
        result = cli("info", *args)
        assert result.exit_code == 2 and result.stdout == ""
        assert result.stderr.count("\n") == 1 and words in result.stderr, result.stderr


# ---------------------------------------------------------------- progress off a terminal


def test_progress_off_a_terminal_is_a_plain_line_every_tenth_of_the_steps(monkeypatch):
    from minigpt.training import progress
    from minigpt.training.events import EvalDone, StepDone

    now = [0.0]
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    lines = progress.training_progress(0, 40)
    assert isinstance(lines, progress.ProgressLines)  # a StringIO is no terminal
    lines.clock, lines.started, lines.said_at = (lambda: now[0]), 0.0, 0.0
    for step in range(1, 41):
        now[0] += 0.5 if step != 30 else 61.0  # step 30 comes after a minute without a line
        if step == 8:
            lines.on_eval(EvalDone(8, 2.5, 1.2))
        lines.on_step(StepDone(step, 40, 3.0 - step / 100, 1e-3, 1234.0, now[0]))
    written = stderr.getvalue()
    assert "\r" not in written
    steps = [int(m) for m in re.findall(r"^step (\d+)/40 ", written, flags=re.M)]
    assert steps == [4, 8, 12, 16, 20, 24, 28, 30, 34, 38, 40]
    assert "step 12/40 (30%): loss 2.880, val 2.500, 1,234 tok/s, 0m06s elapsed, about 0m14s left" in written


def test_the_time_left_follows_the_recent_pace_and_a_slowdown_says_the_machine_is_busy(monkeypatch):
    from minigpt.training import progress
    from minigpt.training.events import StepDone

    now = [0.0]
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    lines = progress.ProgressLines(0, 100, clock=lambda: now[0])
    for step in range(1, 101):
        now[0] += 0.5 if step <= 40 else 1.5  # another program starts at step 41: steps take three times as long
        lines.on_step(StepDone(step, 100, 2.0, 1e-3, 1000.0, now[0]))
    said = {int(m[1]): m[0] for m in re.finditer(r"^step (\d+)/100 .*$", stderr.getvalue(), flags=re.M)}
    assert said[40].endswith("0m20s elapsed, about 0m30s left")  # 60 steps at 0.5 s
    assert said[70].endswith("about 0m45s left, machine busy: steps 3.0x slower than earlier")  # 30 at 1.5 s
    assert "busy" not in said[40]


def test_training_written_to_a_file_shows_plain_progress_lines(cli, tiny_config, tmp_path):
    result = cli("train", "-c", tiny_config, "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "\r" not in result.stderr
    progress_lines = [line for line in result.stderr.splitlines() if line.startswith("step ")]
    assert len(progress_lines) == 10 and progress_lines[-1].startswith("step 20/20 (100%): loss ")
    assert "done: 20 steps" in result.stderr


@pytest.mark.parametrize("switches", SWITCHES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "default")
def test_info_counts_a_run_of_every_model_switch(cli, tmp_path, switches):
    from dataclasses import replace

    from minigpt.config import load_config
    from minigpt.runs.folder import write_model_run
    from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

    cfg = small(**switches)
    tokenizer = TextTokenizer(train_tokenizer("char", 0, "abcdefghijklm"))  # 13 ids
    model = MiniGPT(cfg, tokenizer.vocab_size)
    write_model_run(tmp_path / "run", replace(load_config(), model=cfg), model, tokenizer)
    result = cli("info", "--run", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "the total equals num_parameters()" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()[1:]) <= 80  # the first names the folder
    info = json.loads(cli("info", "--run", tmp_path / "run", "--json").stdout)
    assert info["parameters"]["total"] == model.num_parameters()
    assert info["arithmetic"]["training_flops_per_token"] == training_flops_per_token(model)
    names = [p["name"] for p in info["parameters"]["parts"]]
    assert ("ffn.W1" in names) == bool(cfg.ffn_hidden) and ("norm1" in names) == (cfg.norm != "none")
    assert ("position_table" in names) == (cfg.positions == "learned")
