"""scripts/bench.py (its benchmarks in scripts/benchmarks/): it times the real trainer step (not a
copy of it) and reports both sampling modes on the same model. Tiny sizes: this checks what is
measured, not how fast."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from conftest import need
from hf_folders import random_hf_folder

from minigpt.config import load_config
from minigpt.model.gpt import MiniGPT
from minigpt.text.corpus import load_corpus
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer
from minigpt.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    """scripts/benchmarks, each module by its name (bench.sampling, bench.llama, ...), imported as
    `python scripts/bench.py` imports it: scripts/bench.py, loaded by its path, puts scripts/ on the
    path."""
    spec = importlib.util.spec_from_file_location("bench", REPO / "scripts" / "bench.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    import benchmarks

    for name in ("training", "sampling", "large_data", "processes", "quality", "versions", "patching", "llama"):
        importlib.import_module(f"benchmarks.{name}")
    return benchmarks


def test_training_figure_comes_from_the_trainers_own_step(bench, tiny_config, monkeypatch):
    cfg = load_config(tiny_config, ["train.grad_accum=2"])
    corpus = load_corpus(cfg)
    calls = []
    real = Trainer.train_step

    def counted(self):
        calls.append(self.session.step)
        return real(self)

    monkeypatch.setattr(Trainer, "train_step", counted)
    tokens_per_s = bench.training.train_tokens_per_s(cfg, corpus, threads=1, steps=4, warmup=1)
    assert calls == [0, 1, 2, 3, 4]  # one warm-up step, then four timed ones, each the trainer's
    assert tokens_per_s > 0


def test_sampling_benchmark_reports_both_speeds_on_the_same_tokens(bench, tiny_config):
    cfg = load_config(tiny_config)
    tokenizer = TextTokenizer(train_tokenizer("char", 0, "ROMEO: hello world\n"))
    torch.manual_seed(0)
    model = MiniGPT(cfg.model, tokenizer.vocab_size).eval()
    report = bench.sampling.bench_sampling(model, tokenizer, new_tokens=20, warmup_tokens=2)
    assert report["new_tokens"] == 20 and report["context"] == cfg.model.context
    assert report["same_tokens"] is True
    assert report["with_kv_cache_tokens_per_s"] > 0 and report["without_kv_cache_tokens_per_s"] > 0
    assert report["device"] == "cpu" and report["dtype"] == "float32"
    if "onnxruntime_tokens_per_s" in report:  # the onnx extra (in the test extra): the same tokens
        assert report["onnxruntime_same_tokens"] is True and report["onnxruntime_tokens_per_s"] > 0
    else:
        assert "pip install" in report["onnxruntime"]  # why the row is missing


def test_the_folder_benchmark_writes_distinct_files_and_measures_each_process_alone(bench, tmp_path):
    import hashlib
    import os
    import sys

    written = bench.large_data.write_folder(tmp_path / "corpus", files=20, megabytes=0.2)
    files = sorted((tmp_path / "corpus").rglob("*.txt"))
    assert len(files) == 20 and len({p.parent for p in files}) == 10
    assert written == sum(p.stat().st_size for p in files) and abs(written - 200_000) < 1_000
    assert len({hashlib.sha256(p.read_bytes()).hexdigest() for p in files}) == 20  # no two the same
    big = bench.processes.timed_process(
        [sys.executable, "-c", "b = bytearray(200_000_000); b[::4096] = b'x' * len(b[::4096])"],
        dict(os.environ),
        tmp_path,
    )
    small = bench.processes.timed_process([sys.executable, "-c", "pass"], dict(os.environ), tmp_path)
    assert big["peak_rss_mb"] >= 190 and small["peak_rss_mb"] < 100  # the second is not the first's maximum


@pytest.mark.slow  # seconds of real work: the full suite (and .ci/run) runs it
def test_time_to_quality_stops_at_the_first_evaluation_that_reaches_the_target(bench, tiny_config, tmp_path):
    import os

    env = dict(os.environ)
    reached = bench.quality.minigpt_time_to(str(tiny_config), [], 20, float("inf"), tmp_path / "a", env)
    assert reached["step"] == 10 and reached["seconds"] > 0  # every figure is below infinity: the first
    assert reached["evaluations"][0][1] == 10 and reached["val_bpb"] == reached["evaluations"][0][2]

    missed = bench.quality.minigpt_time_to(str(tiny_config), [], 20, -float("inf"), tmp_path / "b", env)
    assert missed["seconds"] is None and missed["step"] is None
    assert [step for _, step, _ in missed["evaluations"]] == [10, 20]  # ran to its end
    assert missed["val_bpb"] == min(bpb for _, _, bpb in missed["evaluations"])


@pytest.mark.slow  # seconds of real work: the full suite (and .ci/run) runs it
def test_the_versions_children_time_this_checkouts_step_and_api_sampling(bench, tiny_text, tmp_path):
    """`--only versions` measures each checkout in child processes that import it by path: here,
    this checkout's own training step and sampling through its API."""
    import json
    import os
    import subprocess
    import sys

    from conftest import make_run

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    shape = ["model.n_layer=1", "model.n_embd=16", "model.n_head=2", "model.ffn_hidden=32", "model.context=8"]
    shape += ['tokenizer.kind="char"', "train.batch_size=4", f"train.data={json.dumps(str(tiny_text))}"]
    step = subprocess.run(
        [sys.executable, "-c", bench.versions.VERSION_STEP_CHILD, json.dumps(shape), "2", "1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert step.returncode == 0, step.stderr
    assert json.loads(step.stdout.splitlines()[-1])["tokens_per_s"] > 0
    config = make_run(tmp_path / "seeded")
    sample = subprocess.run(
        [sys.executable, "-c", bench.versions.VERSION_SAMPLE_CHILD, str(tmp_path / "seeded" / "run"), "20", "1"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert config.is_file() and sample.returncode == 0, sample.stderr
    assert json.loads(sample.stdout.splitlines()[-1])["tokens_per_s"] > 0


@pytest.mark.slow  # seconds of real work: the full suite (and .ci/run) runs it
def test_the_large_text_child_prepares_the_text_and_takes_a_first_step(bench, tiny_text, tmp_path):
    """The child process the 100 MB figure is timed in, on a small text: it imports this checkout's
    modules and reports each moment it times."""
    import json
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", bench.large_data.LARGE_TEXT_CHILD, str(tiny_text)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["start"] <= r["imported"] <= r["prepared"] <= r["first_step"] and r["train_tokens"] > 0


def test_the_patching_sweeps_arithmetic_counts_the_rows_each_patch_recomputes(bench):
    from minigpt.config import ModelConfig
    from minigpt.inspection.patching import Patch, sweep

    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=4, ffn_hidden=8, context=8)
    per_row = 2 * (4 * 4 * 4 + 2 * 4 * 8)
    # block 0's input at row 1: rows 1..3 of both blocks; before the changed row (2): nothing
    assert bench.patching._patching_flops(cfg, [Patch(0, "input", 1)], 4, 1) == per_row * 3 * 2
    assert bench.patching._patching_flops(cfg, [Patch(0, "input", 1)], 4, 2) == 0
    # past the last block's attention, only the last row reaches the answer
    assert bench.patching._patching_flops(cfg, [Patch(1, "ffn", 2), Patch(1, "ffn", 3)], 4, 0) == per_row * 1 * 1
    # a head at every position starts at the changed row
    assert bench.patching._patching_flops(cfg, [Patch(0, "heads", None, 1)], 4, 1) == per_row * 3 * 2
    # block 0's output is block 1's input: counted once
    assert bench.patching._patching_flops(cfg, [Patch(0, "output", 1), Patch(1, "input", 1)], 4, 0) == per_row * 3 * 1
    assert len(sweep(2, 2, 4, "head")) == 2 * 2 * 5 and len(sweep(2, 2, 4, "stage")) == 2 * 5 * 4


def _tiny_llama_folder(path, dtype=torch.float32):
    """scripts/random_hf_folder.py's builder: a two-block Llama with grouped-query heads and a tied head."""
    return random_hf_folder().make_folder(
        path, n_layer=2, hidden=48, heads=6, kv_heads=2, intermediate=80, vocab=400, max_pos=256, tie=True, dtype=dtype
    )


def test_the_llama_section_runs_both_systems_greedily_on_the_same_folder(bench, tmp_path):
    """`--only llama`'s sampling: minigpt through its API on the imported run and transformers'
    generate on the folder it came from, both float32 from the same weights: the same greedy tokens.
    And the patching prompts: two texts of 20 tokens that differ in one word."""
    need("transformers")
    import minigpt
    from minigpt.api import import_hf

    folder = _tiny_llama_folder(tmp_path / "folder")
    import_hf(folder, tmp_path / "run", progress=False)
    report = bench.llama.llama_sampling(tmp_path / "run", folder, new_tokens=12, rounds=1, thread_counts=[1])
    figures = report["threads_1"]
    assert report["new_tokens"] == 12 and report["prompt"] == "ROMEO:"
    assert figures["same_tokens"] is True and figures["first_different_step"] is None
    assert figures["minigpt_tokens_per_s"] > 0 and figures["transformers_tokens_per_s"] > 0
    assert figures["minigpt_model_itself_tokens_per_s"] > 0  # the loop without the decoding copy
    tokenizer = minigpt.load(tmp_path / "run").tokenizer
    clean, corrupt = bench.llama.equal_length_prompts(tokenizer)
    a, b = tokenizer.encode(clean), tokenizer.encode(corrupt)
    assert len(a) == len(b) == 20 and a != b
    assert sum(x != y for x, y in zip(clean.split(), corrupt.split())) == 1
    rows = []
    bench.llama.llama_rows(
        {"model": "m", "sampling": report, "import": {"wall_s": 1.0, "peak_rss_gib": 0.5}, "patch": {
            "tokens": 20, "command_s": 2.0, "sweep_s": 0.1, "threads": 1}},
        lambda *r, **k: rows.append(r),
    )  # fmt: skip
    assert rows[0][1:3] == (figures["minigpt_tokens_per_s"], figures["transformers_tokens_per_s"])
    assert "same tokens" in rows[0][0] and rows[0][4] == ">= 1.5x"


@pytest.mark.slow  # seconds of real work: the full suite (and .ci/run) runs it
def test_the_import_memory_section_measures_each_import_alone_and_deletes_what_it_wrote(bench, tmp_path):
    """`--only llama-memory` on a tiny bfloat16 folder: the import's own peak memory, the model's
    float32 size from the file's headers, and nothing left behind."""
    import os

    need("transformers")
    built = []

    def build(folder, shape, dtype, env):
        assert dtype == "bfloat16"
        built.append(folder)
        return _tiny_llama_folder(folder, torch.bfloat16)

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    report = bench.llama.llama_memory_benchmark(env, tmp_path, shapes=("tiny",), build=build)["tiny"]
    # the table (400 x 48, tied: stored once); per block q, k, v (48 + 2 x 16 rows), out, gate and
    # up, down and two norms; the final norm
    blocks = 2 * ((48 + 32) * 48 + 48 * 48 + 2 * 80 * 48 + 48 * 80 + 2 * 48)
    assert report["parameters"] == 400 * 48 + blocks + 48
    assert report["float32_gib"] == round(4 * report["parameters"] / 2**30, 2)
    assert 0.05 < report["peak_rss_gib"] < 2 and report["wall_s"] > 0
    assert not built[0].exists() and not (tmp_path / "tiny-run").exists()


@pytest.mark.slow  # seconds of real work: the full suite (and .ci/run) runs it
def test_the_script_measures_one_part_alone_and_prints_a_saved_report(bench, tiny_config, tmp_path):
    """`python scripts/bench.py --only folder`, small and on the tiny config: that part alone, its
    scratch folders removed, its line printed and the JSON report written with the machine; then
    `--table` prints a saved report, each ratio the way round its figure is better."""
    import json
    import os
    import re
    import subprocess
    import sys

    scratch, out = tmp_path / "tmp", tmp_path / "bench.json"
    scratch.mkdir()
    script = [sys.executable, str(REPO / "scripts" / "bench.py")]
    only = ["--only", "folder", "--folder-files", "4", "--folder-mb", "0.05", "-c", str(tiny_config)]
    done = subprocess.run(
        [*script, *only, "--json-out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch)},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    folder = report["folder"]
    assert folder["files"] == 4 and folder["first_run"]["wall_s"] > 0 and folder["cached_run"]["peak_rss_mb"] > 0
    assert report["config"] == str(tiny_config) and report["machine"]["cores"] == os.cpu_count()
    assert report["rows"] == [] and done.stdout.startswith("folder of 4 files, ")
    assert done.stdout.rstrip().endswith(f"(JSON: {out})")
    assert not list(scratch.glob("minigpt-bench-*"))  # the scratch folder and the generated corpus

    row = bench.report.row_writer(report)
    row("more is better", 30.0, 10.0, "tokens/s", ">= 2.5x")
    row("less is better", 2.0, 8.0, "s", "", better="lower")
    row("a cost against its reference", 3.0, 2.0, "s", "<= x1.0", better="of-reference")
    mfu = {"flops_per_token": 1000, "minigpt": 0.25, "minigpt_float32": 0.5, "nanogpt": None}
    out.write_text(json.dumps({**report, "matmul_gflops": {"float32": 100, "bfloat16": 200}, "mfu": mfu}))
    table = subprocess.run([*script, "--table", str(out)], capture_output=True, text=True, check=True).stdout
    assert "matmul peak: float32 100 GFLOP/s, bfloat16 200 GFLOP/s" in table and "MFU minigpt 25.0%" in table
    assert re.search(r"^more is better +30.0 +10.0 +x3.0  >= 2.5x$", table, re.M)  # minigpt / nanoGPT
    assert re.search(r"^less is better +2.0 +8.0 +x4.0  $", table, re.M)  # nanoGPT / minigpt
    assert re.search(r"^a cost against its reference +3.0 +2.0 +x1.5  <= x1.0$", table, re.M)  # minigpt / reference
