"""`--force` replaces a run and nothing else, and a run is never replaced by less: an `--out` that
holds files no run writes, or that is, holds or lies inside what the command reads, is refused
(with `--force` too); every check that can refuse a training run (the config, the model it builds
and its first forward pass, memory, the exercise) runs before its folder is touched, so a refused
`train --force` leaves the run that was there byte for byte; a full disk while a run is written
(an import's, a train's step 0) is one line, exit 1, leaving nothing of the new run and the old one
intact. Through the command line, comparing every file around before and after."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import minigpt_command, need, refused, train_tiny_run, with_failpoints
from test_convert import EOT, TEXT, gpt2_folder, gpt2_model, train_tokenizer

ENOSPC_AT_FIRST_CHECKPOINT = "checkpoint-write@1=raise:ENOSPC"


def tree(folder: Path) -> dict[str, tuple[bytes, int] | None]:
    """Everything under `folder` (hidden too), by its path there: a file's bytes and mtime, None for a folder."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
        for p in sorted(folder.rglob("*"))
    }


def ok(cli, *args):
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """tiny.toml, tiny.txt and a trained run beside them (run/: best.pt and metrics too)."""
    return train_tiny_run(tmp_path_factory.mktemp("trained")).parent


@pytest.fixture
def work(trained, tmp_path) -> Path:
    """A copy of `trained` (its files' bytes and times) to train over."""
    shutil.copytree(trained, tmp_path / "work")
    return tmp_path / "work"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    need("transformers")
    need("safetensors")
    from tokenizers import AddedToken

    tok = train_tokenizer("bpe", 299, TEXT)
    tok.add_special_tokens([AddedToken(EOT, special=True)])
    return gpt2_folder(tmp_path_factory.mktemp("hf") / "gpt2", gpt2_model(), tok)


# ---------------------------------------------------------------- train: refused before anything is written


UNEXPECTED = "a bug in the first forward pass"


@pytest.mark.parametrize(
    "sets, words",
    [
        (["model.sliding_window=4"], "sliding_window = 4 is shorter than [model] context = 8"),  # learned positions
        (['model.positions="rope"', 'model.rope_scaling="yarn:2,beta_fast=nan"'], "beta_fast"),
        (["model.n_embd=15"], "n_embd = 15 is not divisible by n_head = 2"),
        (["model.n_embd=65536", "model.ffn_hidden=262144"], "GiB available"),
        (["train.sample_every=5", 'train.sample_prompt="' + "x" * 20 + '"'], "sample_prompt has 20 tokens"),
        (['model.exercise="rmsnorm"', 'train.exercise_file="{work}/rmsnorm.py"'], "there is none; write it first"),
        (["train.lora_rank=2"], "nothing to adapt"),
    ],
)
def test_a_refused_config_trained_with_force_over_a_run_leaves_it_byte_for_byte(cli, work, sets, words):
    before = tree(work)
    sets = [value.format(work=work) for value in sets]
    line = refused(cli, "train", "-c", work / "tiny.toml", "--out", work / "run", "--force", *_sets(sets))
    assert words in line, line
    assert tree(work) == before


def test_an_unexpected_error_in_the_first_forward_pass_leaves_the_run_byte_for_byte(cli, work, monkeypatch):
    from minigpt.model.gpt import MiniGPT

    def broken(self, *args, **kwargs):
        raise RuntimeError(UNEXPECTED)

    monkeypatch.setattr(MiniGPT, "forward", broken)
    before = tree(work)
    result = cli("train", "-c", work / "tiny.toml", "--out", work / "run", "--force", "--quiet")
    assert result.exit_code != 0 and UNEXPECTED in str(result.exception)
    assert tree(work) == before


def test_force_over_a_run_replaces_it_whole(cli, work):
    old = (work / "run" / "checkpoint.pt").read_bytes()
    ok(cli, "train", "-c", work / "tiny.toml", "--out", work / "run", "--force", "--quiet", "--set", "train.seed=7")
    assert sorted(p.name for p in (work / "run").iterdir()) == [
        "best.pt",
        "checkpoint.pt",
        "config.toml",
        "metrics.jsonl",
        "tokenizer.json",
    ]
    assert (work / "run" / "checkpoint.pt").read_bytes() != old
    assert sorted(p.name for p in work.iterdir()) == ["run", "tiny.toml", "tiny.txt"]  # no temporary, no lock


def _sets(sets: list[str]) -> list[str]:
    return [word for value in sets for word in ("--set", value)]


# ---------------------------------------------------------------- --force replaces a run, nothing else


def test_train_force_refuses_a_folder_holding_files_no_run_writes_naming_one(cli, work):
    (work / "par").mkdir()
    (work / "par" / "notes.txt").write_text("mine", encoding="utf-8")
    (work / "par" / "sub").mkdir()
    (work / "run" / "exercises").mkdir()
    (work / "run" / "exercises" / "notes.md").write_text("mine too", encoding="utf-8")
    before = tree(work)
    for out, named in (
        (work / "par", "notes.txt and no checkpoint.pt, so no run"),
        (work / "run", "exercises/notes.md, which no run writes: it is not a run folder"),
    ):
        for force in (["--force"], []):
            line = refused(cli, "train", "-c", work / "tiny.toml", "--out", out, *force)
            assert f"run folder {out} holds {named}" in line, line
            assert "already holds a run" not in line  # said only of a folder that holds one
    assert tree(work) == before


@pytest.mark.parametrize("name", ["config.toml", "tokenizer.json", "origin.json", "metrics.jsonl", "exercises/ffn.py"])
def test_a_folder_without_a_checkpoint_is_no_run_whatever_its_files_are_named(cli, work, gpt2, name):
    """A run holds its checkpoint from step 0 on (a creation writes in a temporary folder, then moves
    the checkpoint in last), so a folder holding a config.toml or an exercises/ffn.py and no
    checkpoint is the user's: neither train nor import writes over it, with or without --force."""
    mine = work / "mine"
    (mine / name).parent.mkdir(parents=True, exist_ok=True)
    (mine / name).write_text("mine", encoding="utf-8")
    before = tree(work)
    for force in ([], ["--force"]):
        for command in (("train", "-c", work / "tiny.toml"), ("import", "hf", gpt2)):
            line = refused(cli, *command, "--out", mine, *force)
            assert f"run folder {mine} holds {name.split('/')[0]} and no checkpoint.pt, so no run" in line, line
    assert tree(work) == before


def test_an_out_that_is_a_link_is_refused_naming_where_it_leads(cli, work, gpt2):
    link = work / "link"
    link.symlink_to(work / "run")
    before = tree(work)
    for command in (("train", "-c", work / "tiny.toml"), ("import", "hf", gpt2)):
        line = refused(cli, *command, "--out", link, "--force")
        assert f"run folder {link} is a symbolic link to {work / 'run'}; give the folder itself as --out" in line
    assert tree(work) == before


def test_train_refuses_an_out_that_holds_its_config_file(cli, work):
    exp = work / "exp"
    exp.mkdir()
    text = (
        (work / "tiny.toml").read_text(encoding="utf-8").replace('data = "tiny.txt"', f'data = "{work / "tiny.txt"}"')
    )
    (exp / "config.toml").write_text(text, encoding="utf-8")
    before = tree(work)
    line = refused(cli, "train", "-c", exp / "config.toml", "--out", exp)
    assert f"run folder {exp} holds the config file {exp / 'config.toml'}, which this command reads" in line
    assert tree(work) == before


def test_train_refuses_an_out_that_is_holds_or_lies_inside_what_it_reads(cli, work):
    (work / "texts").mkdir()
    shutil.copy(work / "tiny.txt", work / "texts" / "a.txt")
    before = tree(work)
    config = ["-c", work / "tiny.toml"]
    for args, words in (
        (["--init-from", work / "run", "--out", work / "run"], f"is the run it starts from {work / 'run'}"),
        (["--init-from", work / "run", "--out", work], f"holds the run it starts from {work / 'run'}"),
        (["--init-from", work / "run", "--out", work / "run" / "tuned"], "lies inside the run it starts from"),
        (["--data", work / "texts", "--out", work / "texts"], f"is the training data {work / 'texts'}"),
        (["--data", work / "texts", "--out", work / "texts" / "run"], "lies inside the training data"),
        (["--out", work], f"holds the training data {work / 'tiny.txt'}"),
    ):
        line = refused(cli, "train", *config, *args, "--force")
        assert words in line and "which this command reads; choose an --out apart from it" in line, line
    assert tree(work) == before


def test_import_refuses_an_out_that_is_holds_or_lies_inside_the_model_it_reads(cli, gpt2, tmp_path):
    nano = tmp_path / "nano"
    nano.mkdir()
    (nano / "ckpt.pt").write_bytes(b"refused before it is read")
    before, source = tree(tmp_path), tree(gpt2.parent)
    for command, out, words in (
        (["hf", gpt2], gpt2, f"is the model folder {gpt2}"),
        (["hf", gpt2], gpt2.parent, f"holds the model folder {gpt2}"),
        (["hf", gpt2], gpt2 / "run", f"lies inside the model folder {gpt2}"),
        (["nanogpt", nano / "ckpt.pt", "--tokenizer", gpt2], nano, f"holds the nanoGPT checkpoint {nano / 'ckpt.pt'}"),
        (["nanogpt", nano, "--tokenizer", gpt2], nano / "run", f"lies inside the nanoGPT checkpoint {nano}"),
        (["nanogpt", nano, "--tokenizer", gpt2], gpt2, f"is the tokenizer {gpt2}"),
    ):
        line = refused(cli, "import", *command, "--out", out, "--force")
        assert f"run folder {out} {words}, which this command reads" in line, line
    assert tree(tmp_path) == before and tree(gpt2.parent) == source


def test_import_force_replaces_a_run_and_refuses_anything_else(cli, gpt2, tmp_path):
    out, par = tmp_path / "run", tmp_path / "par"
    par.mkdir()
    (par / "notes.txt").write_text("mine", encoding="utf-8")
    (par / "sub").mkdir()
    ok(cli, "import", "hf", gpt2, "--out", out)
    before = tree(tmp_path)
    line = refused(cli, "import", "hf", gpt2, "--out", out)
    assert f"run folder {out} already holds a run; pass --force to replace it" in line
    for force in (["--force"], []):
        line = refused(cli, "import", "hf", gpt2, "--out", par, *force)
        assert (
            f"run folder {par} holds notes.txt and no checkpoint.pt, so no run" in line and "already holds" not in line
        )
    assert tree(tmp_path) == before
    ok(cli, "import", "hf", gpt2, "--out", out, "--force")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["par", "run"]


# ---------------------------------------------------------------- a full disk while a run is written


def _full_disk_at_first_checkpoint(*args) -> str:
    """`minigpt ARGS` as a real process whose first checkpoint write meets a full disk: exit 1 and
    one line, returned."""
    process = subprocess.run(
        minigpt_command(*args),
        capture_output=True,
        text=True,
        timeout=300,
        env=with_failpoints(ENOSPC_AT_FIRST_CHECKPOINT),
    )
    assert process.returncode == 1, process.stderr
    lines = process.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("minigpt: error: ") and process.stdout == "", process.stderr
    return lines[0]


@pytest.mark.slow
def test_an_import_on_a_full_disk_is_one_line_and_leaves_nothing_behind(cli, gpt2, tmp_path):
    out = tmp_path / "new" / "run"
    line = _full_disk_at_first_checkpoint("import", "hf", gpt2, "--out", out)
    assert f"could not write the run folder {out} (No space left on device); nothing of the new run was kept" in line
    assert "make room (or choose another --out), then run the command again" in line
    assert list(tmp_path.iterdir()) == []  # not the run, not its folder, no temporary, no lock
    ok(cli, "import", "hf", gpt2, "--out", tmp_path / "run")
    before = tree(tmp_path)
    line = _full_disk_at_first_checkpoint("import", "hf", gpt2, "--out", tmp_path / "run", "--force")
    assert "nothing of the new run was kept, and the run it was to replace is intact" in line
    assert tree(tmp_path) == before


@pytest.mark.slow
def test_a_train_force_on_a_full_disk_at_step_0_keeps_the_run_it_was_to_replace(work):
    before = tree(work)
    line = _full_disk_at_first_checkpoint("train", "-c", work / "tiny.toml", "--out", work / "run", "--force")
    assert f"could not write the run folder {work / 'run'} (No space left on device)" in line
    assert "and the run it was to replace is intact" in line
    assert tree(work) == before
