"""A run folder runs no code its reader did not choose (issue 44, part 1): a run trained with a
learner's module imports it without asking only when it is the learner's own file, at the absolute
path recorded, outside the run folder, as it was trained; anything else (a relative path, a file
inside the run folder) is refused naming the file and --trust-exercise, and runs once trusted, with
a note on stderr saying which file runs. `info` counts without importing it, and `exercise list`
imports none of the files in exercises/; `exercise check NAME` imports that one alone.

Each learner's file here leaves NAME.imported beside itself when imported, so a file that ran shows;
where nothing may run, every file around the run is compared byte for byte before and after."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import train_tiny_run
from learner_files import MARKS_ITS_IMPORT, files_under, record_learner_file, solution, write_learner

import minigpt
from minigpt.errors import MinigptError

TRUST = "pass --trust-exercise"


@pytest.fixture(scope="module")
def learners_run(tmp_path_factory) -> Path:
    """A tiny run trained with the learner's own (correct) FFN, which marks its imports; the mark
    training left is removed. Shared: a test copies it before changing anything."""
    folder = tmp_path_factory.mktemp("learner")
    mine = write_learner(folder, MARKS_ITS_IMPORT + solution("ffn"))
    run = train_tiny_run(folder, "--exercise", "ffn", "--exercise-file", mine, "--steps", "10")
    mine.with_suffix(".imported").unlink()
    return run


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.txt").write_text("ROMEO: what light through yonder window breaks?\n" * 20)
    return tmp_path


@pytest.fixture
def shared(learners_run, here) -> Path:
    """The crafted folder of the issue: a copy of the run handed to you, carrying exercises/ffn.py of
    its own, which its checkpoints record as `shared/exercises/ffn.py` (a path found from the folder
    the run is read in) with that file's sha256."""
    folder = here / "shared"
    shutil.copytree(learners_run, folder)
    carried = write_learner(folder, MARKS_ITS_IMPORT + solution("ffn") + "# shipped with the run\n")
    record_learner_file(folder, "shared/exercises/ffn.py", carried)
    return folder


READING_COMMANDS = {
    "sample": ("sample", "--run", "shared", "-n", "3"),
    "trace": ("trace", "--run", "shared", "-p", "RO"),
    "eval": ("eval", "--run", "shared", "--data", "tiny.txt"),
    "patch": ("patch", "--run", "shared", "--clean", "RO", "--corrupt", "JU", "--answer", "M", "--versus", "L"),
    "export": ("export", "--run", "shared", "--format", "safetensors", "--out", "exported"),
    "explore": ("explore", "--run", "shared", "--port", "0"),
}


@pytest.mark.parametrize("command", list(READING_COMMANDS))
def test_a_shared_run_folder_carrying_its_own_module_runs_nothing_until_trusted(cli, here, shared, command):
    before = files_under(here)
    refused = cli(*READING_COMMANDS[command])
    assert refused.exit_code == 2, refused.output
    assert refused.stdout == ""
    assert refused.stderr.splitlines() == [
        "minigpt: error: the run shared records its learner's file as shared/exercises/ffn.py, a relative path, "
        "found from wherever the run is read: reading the run would run that code, and a run runs without asking "
        "only the learner's own file, at the absolute path it was trained with; the file that would run is "
        "shared/exercises/ffn.py: read it, and to run it, pass --trust-exercise"
    ]
    assert files_under(here) == before  # no mark: nothing of it ran, nothing was written


def test_trust_exercise_runs_the_shared_file_and_says_which(cli, here, shared):
    sampled = cli("sample", "--run", "shared", "-n", "3", "--trust-exercise")
    assert sampled.exit_code == 0, sampled.output
    note, summary = sampled.stderr.splitlines()
    assert note.startswith("minigpt: note: the model runs the learner's file shared/exercises/ffn.py (exercise ffn, ")
    assert summary.startswith("minigpt: 1 sample, 3 new tokens")
    assert (shared / "exercises" / "ffn.imported").exists()


def test_a_compared_run_is_held_to_the_same_rule(cli, here, learners_run, shared):
    before = files_under(here)
    refused = cli("trace", "--run", learners_run, "-p", "RO", "--compare-run", "shared")
    assert refused.exit_code == 2
    assert "the run shared records its learner's file as shared/exercises/ffn.py" in refused.stderr
    assert files_under(here) == before
    trusted = cli("trace", "--run", learners_run, "-p", "RO", "--compare-run", "shared", "--trust-exercise")
    assert trusted.exit_code == 0, trusted.output
    notes = [line for line in trusted.stderr.splitlines() if line.startswith("minigpt: note: the model runs")]
    assert [note.split(" (")[0].split()[-1] for note in notes] == [
        str(learners_run.parent / "exercises" / "ffn.py"),
        "shared/exercises/ffn.py",
    ]


def test_a_file_inside_the_run_folder_is_refused_though_its_path_is_absolute(cli, here, learners_run):
    copied = here / "copied"
    shutil.copytree(learners_run, copied)
    inside = copied / "exercises" / "ffn.py"  # the run's own copy of the file it was trained with
    record_learner_file(copied, str(inside), inside)
    before = files_under(here)
    refused = cli("sample", "--run", "copied", "-n", "3")
    assert refused.exit_code == 2
    assert refused.stderr.splitlines() == [
        "minigpt: error: the run copied records its learner's file as copied/exercises/ffn.py, inside a run "
        "folder: a folder handed to you can carry code of its own, and reading the run would run it; a run runs "
        "without asking only the learner's own file, outside run folders; the file that would run is "
        "copied/exercises/ffn.py: read it, and to run it, pass --trust-exercise"
    ]
    assert files_under(here) == before
    trusted = cli("sample", "--run", "copied", "-n", "3", "--trust-exercise")
    assert trusted.exit_code == 0, trusted.output
    assert "minigpt: note: the model runs the learner's file copied/exercises/ffn.py" in trusted.stderr


def test_the_learners_own_run_reads_as_before_and_says_which_file_runs(cli, learners_run):
    mine = learners_run.parent / "exercises" / "ffn.py"
    sampled = cli("sample", "--run", learners_run, "-n", "3")
    assert sampled.exit_code == 0, sampled.output
    assert sampled.stderr.splitlines()[0].startswith(
        f"minigpt: note: the model runs the learner's file {mine} (exercise ffn, sha256 "
    )
    run = minigpt.load(learners_run)
    assert [note.split(" (")[0] for note in run.notes] == [f"note: the model runs the learner's file {mine}"]
    assert type(run.model.blocks[0].ffn).__module__.startswith("minigpt_exercise_ffn_")


def test_the_python_api_refuses_the_shared_folder_unless_trust_exercise(here, shared):
    with pytest.raises(MinigptError, match=r"shared/exercises/ffn\.py, a relative path.*pass trust_exercise=True$"):
        minigpt.load(shared)
    assert not (shared / "exercises" / "ffn.imported").exists()
    run = minigpt.load(shared, trust_exercise=True)
    assert run.notes[0].startswith("note: the model runs the learner's file shared/exercises/ffn.py")
    assert (shared / "exercises" / "ffn.imported").exists()


def test_a_run_handed_over_without_its_learners_file_reads_its_own_copy_only_when_trusted(cli, here, learners_run):
    handed = here / "handed"
    shutil.copytree(learners_run, handed)
    record_learner_file(handed, str(here / "elsewhere" / "ffn.py"), handed / "exercises" / "ffn.py")  # not here
    refused = cli("sample", "--run", "handed", "-n", "3")
    assert refused.stderr.splitlines() == [
        "minigpt: error: the run handed was trained with the learner's file elsewhere/ffn.py, which is not there "
        "any more; put it back (the run folder keeps a copy: handed/exercises/ffn.py)"
    ]
    trusted = cli("sample", "--run", "handed", "-n", "3", "--trust-exercise")
    assert trusted.exit_code == 0, trusted.output
    assert "minigpt: note: the model runs the learner's file handed/exercises/ffn.py" in trusted.stderr


def test_info_counts_a_shared_run_without_importing_its_file(minigpt_process, here, shared, learners_run):
    before = files_under(here)
    # a real process: nothing imported before (in this one, a file is imported once per process)
    counted = minigpt_process("info", "--run", "shared", "--json", cwd=here)
    assert counted.returncode == 0, counted.stderr
    assert counted.stderr == ""  # no note: no learner's file runs
    assert files_under(here) == before
    own = minigpt.load(learners_run).model  # the learner's module in it, with the same parameters
    assert json.loads(counted.stdout)["parameters"]["num_parameters"] == own.num_parameters()


def test_exercise_list_imports_none_of_the_files_and_check_imports_only_its_own(cli, here):
    write_learner(here, MARKS_ITS_IMPORT + solution("ffn"))
    write_learner(here, MARKS_ITS_IMPORT + "raise RuntimeError('this file does not import')\n", name="rmsnorm")
    before = files_under(here)
    listed = cli("exercise", "list")
    assert listed.exit_code == 0, listed.output
    assert "             yours: started, exercises/ffn.py" in listed.stdout.splitlines()
    assert files_under(here) == before  # no mark: none of them ran
    checked = cli("exercise", "check", "ffn")
    assert checked.exit_code == 0, checked.output
    assert (here / "exercises" / "ffn.imported").exists()
    assert not (here / "exercises" / "rmsnorm.imported").exists()


@pytest.mark.parametrize("through", ["/proc/self/cwd", "a link"])
def test_a_recorded_path_that_leads_elsewhere_is_refused_and_the_refusal_names_the_file_that_would_run(
    cli, here, learners_run, through
):
    """An absolute path outside the run folder with the right sha256 is not enough: /proc/self/cwd/...
    or a link leads wherever the reader stands, into a folder handed over with the run. Your own file
    of the same name, where a relative path would find it, is not the one the refusal names: the
    flag would run the handed folder's."""
    handed = here / "handed"
    shutil.copytree(learners_run, handed)
    evil = write_learner(here / "evil", MARKS_ITS_IMPORT + solution("ffn") + "# from elsewhere\n")
    if through == "a link":
        (here / "link").symlink_to(here / "evil")
        recorded = str(here / "link" / "exercises" / "ffn.py")
    else:
        recorded = "/proc/self/cwd/evil/exercises/ffn.py"
    record_learner_file(handed, recorded, evil)
    write_learner(here, solution("ffn") + "# mine\n")  # the reader's own exercises/ffn.py
    before = files_under(here)
    line = cli("sample", "--run", "handed", "-n", "3").stderr.strip()
    assert line.startswith(f"minigpt: error: the run handed records its learner's file as {recorded}, which leads to ")
    # named as the file it really is, found from here
    assert line.endswith(
        "the file that would run is evil/exercises/ffn.py: read it, and to run it, pass --trust-exercise"
    )
    assert files_under(here) == before  # nothing ran


def test_training_with_a_learners_file_inside_a_run_folder_runs_it_only_when_trusted(cli, here, learners_run):
    """A handed-over run's config.toml can name the file it carries (a relative exercise_file is found
    from the config's folder): training with that config, or resuming with it, would run that code."""
    handed = here / "handed"
    shutil.copytree(learners_run, handed)
    write_learner(handed, MARKS_ITS_IMPORT + solution("ffn") + "# shipped with the run\n")
    config = handed / "config.toml"
    lines = config.read_text(encoding="utf-8").splitlines()
    config.write_text(
        "\n".join('exercise_file = "exercises/ffn.py"' if line.startswith("exercise_file") else line for line in lines)
        + "\n",
        encoding="utf-8",
    )
    before = files_under(here)
    for out in (["--out", "new", "--steps", "2"], ["--out", "handed", "--resume"]):
        line = cli("train", "-c", config, *out, "--quiet").stderr.strip()
        assert line == (
            "minigpt: error: the learner's file handed/exercises/ffn.py lies inside the run folder handed: a run "
            "folder handed to you can carry code of its own (its config.toml may name it), and training with the file "
            "would run it; train with your own file (--exercise-file FILE), or read this one and, to run it, pass "
            "--trust-exercise"
        ), line
    assert files_under(here) == before  # no mark: nothing of it ran
    trusted = cli("train", "-c", config, "--out", "new", "--steps", "2", "--quiet", "--trust-exercise")
    assert trusted.exit_code == 0, trusted.output
    assert (handed / "exercises" / "ffn.imported").exists()


def test_a_fine_tune_that_finds_no_learners_file_says_its_model_holds_one(cli, here, learners_run):
    elsewhere = here / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "tiny.txt").write_text((here / "tiny.txt").read_text())
    line = cli("train", "--init-from", learners_run, "--data", elsewhere / "tiny.txt", "--out", elsewhere / "tuned")
    assert line.exit_code == 2
    assert line.stderr.strip().startswith(
        f"minigpt: error: the run {learners_run} this fine-tunes was trained with exercise ffn, and its model holds "
        "the learner's module, so the fine-tune trains with the learner's file exercises/ffn.py, which is not there"
    )
