"""`minigpt import hf` and `minigpt import nanogpt` from the command line, as a user runs them: the
imported folder is a run every command reads (trace, sample, eval, export, train --init-from), a
padded vocabulary never samples an id its tokenizer cannot write, and bad input is one line that
leaves nothing behind. The models are tiny and built here (test_convert.py checks the numbers
against transformers and nanoGPT)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import need, refused
from test_convert import (
    CONTEXT,
    EOT,
    TEXT,
    gpt2_folder,
    gpt2_model,
    nanogpt_state,
    save_ckpt,
    train_tokenizer,
    write_meta,
)


@pytest.fixture(autouse=True, scope="module")
def export_extra():
    """transformers and safetensors (in the test extra), imported when the first test here runs."""
    need("transformers")
    need("safetensors")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    from tokenizers import AddedToken

    tok = train_tokenizer("bpe", 299, TEXT)
    tok.add_special_tokens([AddedToken(EOT, special=True)])
    return gpt2_folder(tmp_path_factory.mktemp("hf") / "gpt2", gpt2_model(), tok)


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    """A char-level nanoGPT checkpoint padded past its tokenizer (56 characters, 64 rows)."""
    folder = tmp_path_factory.mktemp("nano")
    args = dict(n_layer=2, n_head=4, n_embd=32, block_size=CONTEXT, bias=False, vocab_size=64, dropout=0.0)
    save_ckpt(folder / "ckpt.pt", nanogpt_state(2, 32, CONTEXT, 64, False, seed=3), args, compiled=True)
    write_meta(folder / "meta.pkl", TEXT)
    return folder


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def ok(cli, *args):
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return result


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoint.pt", weights_only=True)["model"]


def test_an_imported_gpt2_folder_is_a_run_every_command_reads(cli, gpt2, text, tmp_path):
    run = tmp_path / "runs" / "gpt2"
    imported = ok(cli, "import", "hf", gpt2, "--out", run)
    assert imported.stdout == f"{run}\n"
    assert "imported hf-gpt2" in imported.stderr and "2 blocks, 4 heads, width 32, gelu_tanh" in imported.stderr
    trace = json.loads(ok(cli, "trace", "--run", run, "-p", "First Citizen", "--json").stdout)
    assert trace["model"]["activation"] == "gelu_tanh" and len(trace["blocks"]) == 2
    compared = json.loads(
        ok(cli, "trace", "--run", run, "-p", "First", "--scale", "0.attention=0", "--compare", "--json").stdout
    )
    assert compared["kl_divergence"] > 0
    [sample] = [json.loads(line) for line in ok(cli, "sample", "--run", run, "-n", "5", "--json").stdout.splitlines()]
    assert len(sample["token_ids"]) == 5
    scores = json.loads(ok(cli, "eval", "--run", run, "--data", text, "--json").stdout)
    assert scores["tokens"] > 1000 and scores["bits_per_byte"] > 0


def test_export_then_import_gives_back_the_same_weights_and_ids(cli, gpt2, tmp_path):
    first, back = tmp_path / "first", tmp_path / "back"
    ok(cli, "import", "hf", gpt2, "--out", first)
    ok(cli, "export", "--run", first, "--format", "hf", "--out", tmp_path / "exported")
    ok(cli, "import", "hf", tmp_path / "exported", "--out", back)
    a, b = weights(first), weights(back)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (first / "tokenizer.json").read_text() == (back / "tokenizer.json").read_text()


def test_an_imported_model_fine_tunes(cli, gpt2, text, tmp_path):
    run, tuned = tmp_path / "gpt2", tmp_path / "tuned"
    ok(cli, "import", "hf", gpt2, "--out", run, "--context", "8")
    ok(
        cli,
        "train",
        "--init-from",
        run,
        "--data",
        text,
        "--out",
        tuned,
        "--quiet",
        "--steps",
        "6",
        "--set",
        "train.eval_interval=3",
        "--set",
        "train.batch_size=8",
        "--set",
        "train.optimizer=adamw",
        "--set",
        "train.learning_rate=1e-3",
        "--set",
        "train.warmup_steps=1",
    )
    evals = [json.loads(line) for line in (tuned / "metrics.jsonl").read_text().splitlines()]
    evals = [r["val_loss"] for r in evals if r.get("eval")]
    assert len(evals) == 3 and evals[-1] < evals[0]
    assert (tuned / "tokenizer.json").read_bytes() == (run / "tokenizer.json").read_bytes()
    assert json.loads((tuned / "origin.json").read_text())["run"] == str(run)


def test_a_padded_nanogpt_vocabulary_is_kept_exact_and_never_sampled(cli, nano, tmp_path):
    run = tmp_path / "nano"
    imported = ok(cli, "import", "nanogpt", nano, "--meta", nano / "meta.pkl", "--out", run)
    assert "rows 56..63 are padding, never sampled" in imported.stderr
    assert weights(run)["token_table.weight"].shape[0] == 64
    # Weights scaled so that the padded rows would be drawn often if they could be.
    lines = ok(cli, "sample", "--run", run, "-n", "200", "--temperature", "5", "--json", "--num-samples", "3").stdout
    for sample in map(json.loads, lines.splitlines()):
        assert len(sample["token_ids"]) == 200 and max(sample["token_ids"]) < 56


def test_context_crops_the_table_and_longer_prompts_are_then_refused(cli, gpt2, tmp_path):
    run = tmp_path / "short"
    ok(cli, "import", "hf", gpt2, "--out", run, "--context", "4")
    assert weights(run)["position_table.weight"].shape[0] == 4
    line = refused(cli, "trace", "--run", run, "--ids", "1,2,3,4,5")
    assert "has 5 tokens but the position table has 4 rows" in line


def test_import_refusals_are_one_line_and_leave_nothing_behind(cli, gpt2, nano, tmp_path):
    out = tmp_path / "out"
    for args, words in (
        (("hf", tmp_path / "nowhere"), "nowhere"),
        (("hf", gpt2, "--context", "0"), "--context 0"),
        (("hf", gpt2, "--context", "999"), "--context 999"),
        (("nanogpt", nano), "pass exactly one of --meta"),
        (("nanogpt", nano, "--meta", nano / "meta.pkl", "--tokenizer", gpt2), "pass exactly one of --meta"),
    ):
        line = refused(cli, "import", *args, "--out", out)
        assert words in line, line
        assert not out.exists()
    ok(cli, "import", "hf", gpt2, "--out", out)
    line = refused(cli, "import", "hf", gpt2, "--out", out)
    assert f"run folder {out} already holds a run; pass --force to replace it, or another --out" in line
    ok(cli, "import", "hf", gpt2, "--out", out, "--force")
