"""The files an output flag writes (`eval --png` and `--per-token`, `trace --png`, `patch --png`,
`plot -o`): each checks the ending of what it writes, refuses a path inside a run folder (even with
`--force`), replaces an existing file only with `--force`, writes atomically (a failed write leaves
the file that was there), and refuses before the work that fills it. Through the command line,
comparing the files around byte for byte."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from conftest import need, refused, train_tiny_run

PNG = b"\x89PNG\r\n\x1a\n"
MINE = b"a file of mine"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """A trained run, and 1,000 characters of its text to score."""
    need("matplotlib")
    run = train_tiny_run(tmp_path_factory.mktemp("outputs"), "--steps", "5")
    text = run.parent / "val.txt"
    text.write_text((run.parent / "tiny.txt").read_text(encoding="utf-8")[-1_000:], encoding="utf-8")
    return run, text


# Each output flag: the command line that writes PATH, the flag as it refuses, and what it writes.
WRITERS = {
    "eval --png": (lambda run, text, path: ["eval", "--run", run, "--data", text, "--by-position", "--png", path]),
    "eval --per-token": (lambda run, text, path: ["eval", "--run", run, "--data", text, "--per-token", path]),
    "trace --png": (lambda run, text, path: ["trace", "--run", run, "-p", "ROMEO:", "--png", path]),
    "patch --png": (
        lambda run, text, path: (
            ["patch", "--run", run, "--clean", "the", "--corrupt", "she", "--answer", " "]
            + ["--versus", "e", "--png", path]
        )
    ),
    "plot -o": (lambda run, text, path: ["plot", run, "-o", path]),
}
FLAG = {name: name.split()[1].replace("-o", "--out") for name in WRITERS}
SUFFIX = {name: ".jsonl" if name == "eval --per-token" else ".png" for name in WRITERS}


def tree(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def written(name: str, path: Path) -> bool:
    """Whether `path` holds what the flag `name` writes: a PNG, or a JSON object per line."""
    data = path.read_bytes()
    if SUFFIX[name] == ".png":
        return data.startswith(PNG)
    return all(set(json.loads(line)) == {"position", "id", "token", "surprisal_bits"} for line in data.splitlines())


@pytest.mark.parametrize("name", WRITERS)
def test_an_output_flag_writes_a_new_file_and_replaces_one_only_with_force(cli, trained, tmp_path, name):
    run, text = trained
    path = tmp_path / f"out{SUFFIX[name]}"
    result = cli(*WRITERS[name](run, text, path))
    assert result.exit_code == 0, result.output
    assert written(name, path)
    path.write_bytes(MINE)
    line = refused(cli, *WRITERS[name](run, text, path))
    assert f"{FLAG[name]} {path} already exists; pass --force to replace it, or choose another path" in line
    assert path.read_bytes() == MINE
    result = cli(*WRITERS[name](run, text, path), "--force")
    assert result.exit_code == 0, result.output
    assert written(name, path) and sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary


@pytest.mark.parametrize("name", WRITERS)
def test_an_output_flag_refuses_a_name_not_ending_in_what_it_writes(cli, trained, tmp_path, name):
    run, text = trained
    for path in (tmp_path / "out.txt", tmp_path / "out"):
        line = refused(cli, *WRITERS[name](run, text, path), "--force")
        assert f"{FLAG[name]} {path} does not end in {SUFFIX[name]}, and {FLAG[name]} writes" in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", WRITERS)
def test_an_output_flag_never_writes_into_a_run_folder(cli, trained, name):
    run, text = trained
    before = tree(run)
    for path in (run / "checkpoint.pt", run / "metrics.jsonl", run / f"loss{SUFFIX[name]}", run / "x" / "y.png"):
        line = refused(cli, *WRITERS[name](run, text, path), "--force")
        if path.suffix == SUFFIX[name]:
            assert f"{FLAG[name]} {path} lies inside the run folder {run}, which holds its run's own files" in line
        else:
            assert "does not end in" in line
    assert tree(run) == before


@pytest.mark.parametrize("name", ["eval --png", "trace --png", "patch --png", "plot -o"])
def test_force_without_an_output_flag_is_refused_not_ignored(cli, trained, name):
    run, text = trained
    args = WRITERS[name](run, text, "unused")[:-2]  # the command without its output flag
    line = refused(cli, *args, "--force")
    assert "--force replaces an existing" in line and "leave out --force" in line


def test_eval_without_an_output_file_refuses_force(cli, trained):
    run, text = trained
    line = refused(cli, "eval", "--run", run, "--data", text, "--force")
    assert "--force replaces an existing --per-token or --png file, and neither is given" in line


def test_a_write_that_fails_midway_leaves_the_file_that_was_there(cli, trained, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    run, _ = trained
    path = tmp_path / "curves.png"
    path.write_bytes(MINE)

    def full_disk(self, file, **kwargs):
        file.write(PNG + b"half an image")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Figure, "savefig", full_disk)
    line = refused(cli, "plot", run, "-o", path, "--force")
    assert f"--out {path} cannot be written (No space left on device); choose another path" in line
    assert path.read_bytes() == MINE and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_refused_output_is_refused_before_the_run_is_read(cli, tmp_path):
    """The path is checked first: a run that does not exist is never reached."""
    (tmp_path / "out.png").write_bytes(MINE)
    line = refused(cli, "trace", "--run", tmp_path / "nowhere", "-p", "a", "--png", tmp_path / "out.png")
    assert "already exists" in line and "nowhere" not in line
    line = refused(cli, "plot", tmp_path / "nowhere", "-o", tmp_path / "missing" / "out.png")
    assert f"--out {tmp_path / 'missing' / 'out.png'}: there is no folder {tmp_path / 'missing'} to write it in" in line
    assert [p.name for p in tmp_path.iterdir()] == ["out.png"]


def test_trace_png_of_a_comparison_without_attribution_is_refused_not_ignored(cli, trained, tmp_path):
    run, _ = trained
    compared = ["trace", "--run", run, "-p", "ROMEO", "--scale", "0.attention=0.5", "--compare"]
    line = refused(cli, *compared, "--png", tmp_path / "c.png")
    assert "--png draws a comparison of two passes only as its attribution's parts; add --attribute TOKEN" in line
    assert list(tmp_path.iterdir()) == []
    result = cli(*compared, "--attribute", "E", "--png", tmp_path / "c.png")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "c.png").read_bytes().startswith(PNG)
