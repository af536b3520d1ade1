"""`train --resume` with a [model] other than its checkpoint's is refused naming the keys, and tells
the user what train takes to resume the run (its own config.toml with -c), not a flag it lacks
(issue 44: it said "pass --run DIR alone", and train has no --run)."""

from __future__ import annotations

from conftest import refused, train_tiny_run


def test_a_resume_with_another_model_section_says_to_resume_with_the_runs_own_config(cli, tmp_path):
    run = train_tiny_run(tmp_path, "--steps", "4")
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    line = refused(cli, "train", "-c", tmp_path / "tiny.toml", "--out", run, "--resume", "--set", "model.n_layer=2")
    assert line == (
        f"minigpt: error: --resume {run}: its checkpoint was trained with another [model] section than "
        f"{tmp_path / 'tiny.toml'} with overrides model.n_layer=2 (n_layer: 2 != 1 (config != checkpoint)); resume "
        f"with the config it was trained with, saved in the run folder: --config {run / 'config.toml'} --resume "
        "(without --set values for [model]), or train a new run with another --out"
    )
    assert "--run" not in line
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before
    # the advice works as written: the run's own config resumes it (here: already finished)
    result = cli("train", "-c", run / "config.toml", "--resume", "--quiet")
    assert result.exit_code == 0, result.output
