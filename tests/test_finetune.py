"""`minigpt train --init-from RUN`: a fine-tune starts from RUN's weights with RUN's [model] and
tokenizer (never refitted), a fresh optimizer and its own [train] schedule; it records where it
started, is scored on the new text before its first step, resumes exactly, and refuses what it
cannot do in one line. Tiny char-level runs, so every test is fast."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SHAKESPEARE, train_tiny_run

from minigpt.config import load_config
from minigpt.runs.reading import load_model
from minigpt.training.events import Listener, StepDone
from minigpt.training.listeners import CheckpointSaver
from minigpt.training.session import TrainingSession
from minigpt.training.trainer import Trainer, evaluate


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A tiny char run (trained on the first 20,000 characters of Tiny Shakespeare)."""
    return train_tiny_run(tmp_path_factory.mktemp("source"))


@pytest.fixture
def new_text(tmp_path, source):
    """Later Shakespeare, in the characters the source's char tokenizer knows."""
    _, tokenizer = load_model(load_config(source / "config.toml"), source)
    known = tokenizer.alphabet
    text = "".join(c for c in SHAKESPEARE.read_text(encoding="utf-8")[60_000:90_000] if c in known)
    path = tmp_path / "new.txt"
    path.write_text(text, encoding="utf-8")
    return path


def fine_tune(cli, source, new_text, out, *extra):
    result = cli(
        "train", "-c", source.parent / "tiny.toml", "--init-from", source, "--data", new_text, "--out", out, *extra
    )
    assert result.exit_code == 0, result.output
    return result


def metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


def weights(run):
    return torch.load(run / "checkpoint.pt", weights_only=True)["model"]


def test_a_fine_tune_starts_where_its_source_stands_and_its_loss_falls(cli, source, new_text, tmp_path):
    out = tmp_path / "ft"
    fine_tune(cli, source, new_text, out, "--quiet", "--steps", "30", "--set", "train.eval_interval=10")
    evals = [r for r in metrics(out) if r.get("eval")]
    # Its first evaluation is at step 0, before any update: the source model on the same windows.
    cfg = load_config(out / "config.toml")
    model, tokenizer = load_model(load_config(source / "config.toml"), source)
    from minigpt.text.corpus import Batches, load_corpus

    corpus = load_corpus(cfg, tokenizer=tokenizer)
    windows = Batches(corpus.val_ids, cfg.model.context, cfg.train.batch_size).fixed(cfg.train.eval_batches)
    assert evals[0]["step"] == 0
    assert evals[0]["val_loss"] == evaluate(model, windows, corpus.val_tokens_per_byte)["val_loss"]
    assert [r["step"] for r in evals] == [0, 10, 20, 30]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.05  # it learns the new text
    steps = [r for r in metrics(out) if "loss" in r and not r.get("eval")]
    assert steps[-1]["loss"] < steps[0]["loss"]


def test_a_fine_tune_keeps_the_source_tokenizer_and_model_and_records_its_origin(cli, source, new_text, tmp_path):
    out = tmp_path / "ft"
    fine_tune(cli, source, new_text, out, "--quiet", "--steps", "5")
    assert (out / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    saved, theirs = load_config(out / "config.toml"), load_config(source / "config.toml")
    assert saved.model == theirs.model and saved.tokenizer == theirs.tokenizer
    assert saved.train.init_from == str(source) and saved.train.steps == 5  # its own [train]
    origin = json.loads((out / "origin.json").read_text(encoding="utf-8"))
    import hashlib

    assert origin == {
        "kind": "init_from",
        "run": str(source),
        "checkpoint": "last",
        "sha256": hashlib.sha256((source / "checkpoint.pt").read_bytes()).hexdigest(),
    }
    assert torch.load(out / "checkpoint.pt", weights_only=True)["origin"] == origin
    # a fresh optimizer: AdamW's step count starts again at the fine-tune's own steps
    state = torch.load(out / "checkpoint.pt", weights_only=True)["optimizer"]["state"]
    assert {float(s["step"]) for s in state.values()} == {5.0}


def test_the_best_weights_of_the_source_can_be_the_start(cli, source, new_text, tmp_path):
    out = tmp_path / "ft"
    fine_tune(cli, source, new_text, out, "--quiet", "--steps", "1", "--init-checkpoint", "best")
    assert json.loads((out / "origin.json").read_text())["checkpoint"] == "best"


class StopAt(Listener):
    def __init__(self, trainer_box, step):
        self.box, self.step = trainer_box, step

    def on_step(self, event: StepDone) -> None:
        if event.step == self.step:
            self.box[0].request_stop()


def test_an_interrupted_fine_tune_resumes_bitwise(cli, source, new_text, tmp_path):
    settings = ["--steps", "24", "--set", "train.checkpoint_interval=8", "--set", "train.eval_interval=8"]
    straight = tmp_path / "straight"
    fine_tune(cli, source, new_text, straight, "--quiet", *settings)

    run = tmp_path / "interrupted"
    cfg = load_config(
        source.parent / "tiny.toml",
        ["train.steps=24", "train.checkpoint_interval=8", "train.eval_interval=8"],
        {"train": {"init_from": str(source), "data": str(new_text), "out": str(run)}},
    )
    box = []
    with TrainingSession(cfg) as session:
        box.append(Trainer(session, [CheckpointSaver(session), StopAt(box, 13)]))
        result = box[0].run()
    assert result.stopped and result.step == 13
    fine_tune(cli, source, new_text, run, "--quiet", *settings, "--resume")
    a, b = weights(straight), weights(run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------ refusals, one line each


def one_line(result, code=2):
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minigpt: error: "), result.stderr
    return lines[0]


def test_a_model_section_that_differs_from_the_source_is_refused_naming_the_keys(cli, source, new_text, tmp_path):
    out = tmp_path / "ft"
    line = one_line(
        cli(
            "train",
            "-c",
            source.parent / "tiny.toml",
            "--init-from",
            source,
            "--data",
            new_text,
            "--out",
            out,
            "--set",
            "model.n_layer=2",
            "--set",
            "tokenizer.kind=byte",
        )
    )
    assert "a fine-tune keeps the [model] and [tokenizer] of the run it starts from" in line
    assert "[model] n_layer: 2 != 1" in line and "[tokenizer] kind: 'byte' != 'char'" in line
    assert not out.exists()


def test_dropout_may_differ_in_a_fine_tune(cli, source, new_text, tmp_path):
    out = tmp_path / "ft"
    fine_tune(cli, source, new_text, out, "--quiet", "--steps", "2", "--set", "model.dropout=0.1")
    assert load_config(out / "config.toml").model.dropout == 0.1


def test_init_from_a_folder_that_is_not_a_run_is_refused(cli, source, new_text, tmp_path):
    (tmp_path / "empty").mkdir()
    for where, words in (
        (tmp_path / "nowhere", "no such run folder"),
        (tmp_path / "empty", "is not a run folder (it has no checkpoint.pt)"),
    ):
        line = one_line(cli("train", "--init-from", where, "--data", new_text, "--out", tmp_path / "ft"))
        assert line.startswith(f"minigpt: error: --init-from {where}") and words in line, line
    assert not (tmp_path / "ft").exists()


def test_a_text_the_char_tokenizer_cannot_write_is_refused_naming_the_first_character(cli, source, tmp_path):
    text = tmp_path / "odd.txt"
    text.write_text("ROMEO:\nhello\nthere é and ü\n" * 40, encoding="utf-8")
    line = one_line(cli("train", "--init-from", source, "--data", text, "--out", tmp_path / "ft"))
    assert "has 'é' at character 19 (line 3), which the run's char tokenizer cannot write" in line
    assert not (tmp_path / "ft").exists()
