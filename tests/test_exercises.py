"""`minigpt exercise`: a learner starts a file, checks it (one line per check, the mistake in words),
then trains and traces a model with the module in it; the run records the file and every command
on it uses that module, refusing the file by name once it has changed."""

from __future__ import annotations

import hashlib
import shutil
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from minigpt.config import SampleConfig
from minigpt.exercises.catalogue import EXERCISES
from minigpt.exercises.checks import check_file
from minigpt.exercises.folder import starter_text
from minigpt.exercises.learner import read_learner
from minigpt.exercises.plug import parts_of
from minigpt.model.fold import unfoldable
from minigpt.model.gpt import MiniGPT
from minigpt.model.recorder import Recorder
from minigpt.sampling.generate import generate

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "tests" / "data" / "exercises"


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    """A learner's folder, the current one."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def solve(folder: Path, name: str, text: str | None = None) -> Path:
    """exercises/NAME.py holding the kept solution (or `text`)."""
    path = folder / "exercises" / f"{name}.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text if text is not None else (SOLUTIONS / f"{name}.py").read_text(encoding="utf-8"))
    return path


def lines_of(result) -> list[str]:
    return result.stdout.splitlines()


# ---------------------------------------------------------------- start, check, list


def test_start_then_check_fails_naming_the_mean_centring_and_the_replacing(cli, here):
    started = cli("exercise", "start", "rmsnorm")
    assert started.exit_code == 0, started.stderr
    assert (here / "exercises" / "rmsnorm.py").read_text() == starter_text("rmsnorm")
    checked = cli("exercise", "check", "rmsnorm")
    assert checked.exit_code == 1
    out = lines_of(checked)
    assert out[0] == "checking exercises/rmsnorm.py (lesson 09: RMSNorm and a residual sublayer)"
    assert (
        "  FAIL  your RMSNorm subtracts the mean: [2, 2, 2, 2] became [0, 0, 0, 0]; RMSNorm divides by the root "
        "mean square without centring, which keeps it [1, 1, 1, 1]"
    ) in out
    assert any(line.startswith("  FAIL  your residual_sublayer replaces instead of adding") for line in out)
    assert out[-1] == "  ok    residual_sublayer leaves x unchanged (no in-place edit)"
    assert checked.stderr.splitlines() == [
        "minigpt: error: rmsnorm: 6 of 18 checks fail; fix the first, then check again"
    ]
    assert [line[:6] for line in out[1:]].count("  FAIL") == 6 and len(out[1:]) == 18  # the count is what is shown


def test_start_refuses_to_overwrite_a_learners_file_and_force_replaces_it(cli, here):
    path = solve(here, "rmsnorm")
    refused = cli("exercise", "start", "rmsnorm")
    assert refused.exit_code == 2
    assert refused.stderr.strip().splitlines() == [
        "minigpt: error: exercises/rmsnorm.py already exists (your work on rmsnorm); check it as it is, or start "
        "again from the starter with --force, which replaces it"
    ]
    assert path.read_text() == (SOLUTIONS / "rmsnorm.py").read_text()
    assert cli("exercise", "start", "rmsnorm", "--force").exit_code == 0
    assert path.read_text() == starter_text("rmsnorm")


def test_a_correct_implementation_passes_and_says_how_to_train_with_it(cli, here):
    solve(here, "rmsnorm")
    checked = cli("exercise", "check", "rmsnorm")
    assert checked.exit_code == 0, checked.stdout
    assert all(line.startswith("  ok    ") for line in lines_of(checked)[1:-1])
    assert lines_of(checked)[-1] == "rmsnorm: all 18 checks pass; train with it: minigpt train --exercise rmsnorm"


def test_another_folder_is_named_in_the_commands_shown(cli, here):
    started = cli("exercise", "start", "ffn", "--dir", "mine")
    assert lines_of(started)[-1] == "check it with: minigpt exercise check ffn --dir mine"
    shutil.copy(SOLUTIONS / "ffn.py", here / "mine" / "ffn.py")
    checked = cli("exercise", "check", "ffn", "--dir", "mine")
    assert lines_of(checked)[-1].endswith("train with it: minigpt train --exercise ffn --exercise-file mine/ffn.py")


@pytest.mark.parametrize("name", list(EXERCISES))
def test_every_starter_fails_and_the_kept_solution_passes(name, tmp_path):
    starter = tmp_path / f"{name}.py"
    starter.write_text(starter_text(name))
    assert not check_file(read_learner(name, starter)).passed
    report = check_file(read_learner(name, SOLUTIONS / f"{name}.py"))
    assert report.passed, [r.line for r in report.failures]
    assert report.total == len(report.results) >= 8


# Each mistake's first failing line: tests/test_exercise_mistakes.py, a table per exercise.


def test_block_is_checked_against_table_17_1(tmp_path):
    path = tmp_path / "block.py"
    # Right wiring, but the FFN's update added twice: only the chapter's numbers tell.
    path.write_text((SOLUTIONS / "block.py").read_text().replace("residual1 + self.ffn(", "residual1 + 2 * self.ffn("))
    failing = [r.line for r in check_file(read_learner("block", path)).failures]
    assert any(line.startswith("on chapter 17's weights your Block's Y is [[") for line in failing), failing
    assert any("Table 17.1's is [[1.99998, 2.99994], [0.999912, 1.476742], [2.999964, 3.746396]]" in x for x in failing)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("def RMSNorm(:\n", "minigpt: error: exercises/rmsnorm.py does not import: SyntaxError: "),
        ("import torch\nraise RuntimeError('boom')\n", "does not import: RuntimeError: boom, line 2; fix it and check"),
        ("import torch\n", "minigpt: error: exercises/rmsnorm.py defines no RMSNorm and no residual_sublayer"),
    ],
    ids=["syntax error", "raises on import", "lacks the names"],
)
def test_a_file_that_cannot_be_checked_gets_one_line_and_no_traceback(cli, here, text, words):
    solve(here, "rmsnorm", text)
    checked = cli("exercise", "check", "rmsnorm")
    assert checked.exit_code == 2
    lines = checked.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines
    assert "Traceback" not in checked.stderr + checked.stdout


def test_code_that_raises_when_called_is_one_line_and_stops_that_names_checks(cli, here):
    solve(here, "swiglu", starter_text("swiglu"))
    checked = cli("exercise", "check", "swiglu")
    assert checked.exit_code == 1
    failing = [line for line in lines_of(checked) if line.startswith("  FAIL")]
    assert failing == [
        "  FAIL  SwiGLU.forward raised NotImplementedError: SwiGLU.forward: gate, value = halves of self.W1(n); "
        "SiLU(gate) * value; self.W2, line 42; the other 12 checks of SwiGLU were not run"
    ]
    assert checked.stderr.strip() == (
        "minigpt: error: swiglu: 1 of 15 checks fails, and 12 were not run; fix the first, then check again"
    )


def test_checking_a_file_not_started_says_how_to_start_it(cli, here):
    checked = cli("exercise", "check", "attention")
    assert checked.exit_code == 2
    assert checked.stderr.strip() == (
        "minigpt: error: there is no exercises/attention.py; start the exercise with: minigpt exercise start attention"
    )
    assert cli("exercise", "check", "rmsnrm").stderr.strip() == (
        "minigpt: error: there is no exercise 'rmsnrm' (did you mean 'rmsnorm'?); the exercises are rmsnorm, "
        "layernorm, ffn, attention, block, swiglu, rope, alibi, gqa, attention_residual"
    )


def test_list_shows_each_exercise_its_text_what_it_replaces_and_where_yours_stands(cli, here):
    solve(here, "rmsnorm")
    solve(here, "layernorm", starter_text("layernorm"))
    solve(here, "ffn", "this is not python(\n")
    listed = cli("exercise", "list")
    assert listed.exit_code == 0
    out = lines_of(listed)
    assert out[0] == (
        "exercises in exercises/ (start one with: minigpt exercise start NAME; run your file's checks with: "
        "minigpt exercise check NAME)"
    )
    assert out[1:4] == [
        "  rmsnorm    lesson 09: RMSNorm and a residual sublayer",
        "             yours: started, exercises/rmsnorm.py",
        "             in a model: every norm (norm1, norm2, final_norm) is your RMSNorm (residual_sublayer: checked, "
        "not plugged in)",
    ]
    # list runs none of the files (tests/test_exercise_trust.py): started is all it says, broken or not
    assert out[5] == "             yours: started, exercises/layernorm.py"
    assert out[8] == "             yours: started, exercises/ffn.py"
    assert out[11] == "             yours: not started"
    assert "  block      chapter 17.5, Table 17.1: the pre-norm block" in out


def test_the_starters_are_package_data():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "starters/*.py" in pyproject["tool"]["setuptools"]["package-data"]["minigpt.exercises"]
    for name in EXERCISES:
        text = starter_text(name)
        assert text == (REPO / "minigpt" / "exercises" / "starters" / f"{name}.py").read_text()
        assert f"minigpt exercise check {name}" in text and f"minigpt train --exercise {name}" in text


# ---------------------------------------------------------------- the learner's module in a model

# Where a model built with each exercise holds the learner's code: a class of the learner's file, or
# (rope, alibi) the learner's function, which the model calls where minigpt computes its own.
LEARNERS_PART = {
    "rmsnorm": lambda m: type(m.final_norm),
    "layernorm": lambda m: type(m.blocks[1].norm2),
    "ffn": lambda m: type(m.blocks[0].ffn),
    "swiglu": lambda m: type(m.blocks[1].ffn),
    "attention": lambda m: type(m.blocks[0].attention),
    "gqa": lambda m: type(m.blocks[1].attention),
    "block": lambda m: type(m.blocks[1]),
    "rope": lambda m: m.blocks[1].attention.positions.apply_rope,
    "alibi": lambda m: m.blocks[1].attention.positions.bias_of,
    "attention_residual": lambda m: type(m.final_depth),
}


@pytest.mark.parametrize("name", list(EXERCISES))
def test_a_model_with_the_learners_module_records_and_samples_what_minigpts_own_does(name):
    """The same weights in minigpt's model and in one built with the learner's (correct) module: every
    recorded stage, the logits and greedy samples with and without the KV cache agree. Four heads, so
    that gqa's two kv heads are shared by two query heads each; the queries over depth drawn, so
    that a read over depth is no plain average."""
    from minigpt.config import ModelConfig, load_config, with_exercise

    cfg = with_exercise(replace(load_config(None), model=replace(ModelConfig(), exercise=name))).model
    cfg = replace(cfg, n_layer=2, n_head=4, n_embd=8, ffn_hidden=12, context=8, dtype="float64")
    torch.manual_seed(0)
    mine = MiniGPT(cfg, 11, parts_of(read_learner(name, SOLUTIONS / f"{name}.py"))).eval()
    with torch.no_grad():
        for key, parameter in mine.named_parameters():
            if key.endswith(".query"):
                parameter.normal_()
    own = MiniGPT(replace(cfg, exercise="none"), 11).eval()
    own.load_state_dict(mine.state_dict())
    assert set(LEARNERS_PART) == set(EXERCISES)
    assert LEARNERS_PART[name](mine).__module__.startswith(f"minigpt_exercise_{name}_")
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    recorded, expected = Recorder(cfg), Recorder(own.cfg)
    with torch.no_grad():
        logits, theirs = mine(ids, recorder=recorded)[0], own(ids, recorder=expected)[0]
    assert list(recorded.stages) == list(expected.stages)
    for stage in expected.stages:
        assert torch.allclose(recorded[stage], expected[stage], atol=1e-12), stage
    assert torch.allclose(logits, theirs, atol=1e-12)
    settings = SampleConfig(max_new_tokens=10, greedy=True)
    cached = [int(s.tokens[0]) for s in generate(mine, [1, 2], settings, use_cache=True)]
    assert cached == [int(s.tokens[0]) for s in generate(mine, [1, 2], settings, use_cache=False)]
    assert cached == [int(s.tokens[0]) for s in generate(own, [1, 2], settings, use_cache=True)]
    assert unfoldable(mine) is not None  # run as written: sampling never swaps in minigpt's plain norm


# ---------------------------------------------------------------- train, trace, refuse


def _train(cli, config: Path, *args) -> object:
    return cli("train", "-c", config, "--exercise", "rmsnorm", "--quiet", *args)


def test_train_refuses_a_file_that_does_not_pass_its_checks(cli, here, tiny_config):
    solve(here, "rmsnorm", starter_text("rmsnorm"))
    refused = _train(cli, tiny_config)
    assert refused.exit_code == 2
    assert refused.stderr.strip().splitlines() == [
        "minigpt: error: --exercise rmsnorm: exercises/rmsnorm.py does not pass its checks (6 of 18 checks fail; "
        "the first: your RMSNorm subtracts the mean: [2, 2, 2, 2] became [0, 0, 0, 0]; RMSNorm divides by the root "
        "mean square without centring, which keeps it [1, 1, 1, 1]); a model is trained only with a module that "
        "passes every check"
    ]
    assert not (here / "runs").exists()


def test_train_refuses_a_norm_the_exercise_does_not_put_there(cli, here, tiny_config):
    solve(here, "rmsnorm")
    refused = _train(cli, tiny_config, "--set", "model.norm=layernorm")
    assert refused.exit_code == 2
    assert (
        'needs [model] norm = "rmsnorm"' in refused.stderr
        and 'but the config sets norm = "layernorm"' in refused.stderr
    )


@pytest.fixture
def exercise_run(cli, here, tiny_config) -> Path:
    """A tiny run trained 50 steps with the learner's (correct) RMSNorm at every norm."""
    solve(here, "rmsnorm")
    trained = _train(cli, tiny_config, "--steps", "50", "--out", here / "run")
    assert trained.exit_code == 0, trained.stderr
    return here / "run"


def test_a_run_records_the_learners_file_and_keeps_a_copy(exercise_run, here):
    source = (here / "exercises" / "rmsnorm.py").read_bytes()
    config = tomllib.loads((exercise_run / "config.toml").read_text())
    assert (config["model"]["exercise"], config["model"]["norm"]) == ("rmsnorm", "rmsnorm")
    assert config["train"]["exercise_file"] == str(here / "exercises" / "rmsnorm.py")
    for checkpoint in ("checkpoint.pt", "best.pt"):
        record = torch.load(exercise_run / checkpoint, weights_only=True)["exercise"]
        assert record["sha256"] == hashlib.sha256(source).hexdigest()
        assert record["file"] == str(here / "exercises" / "rmsnorm.py")
    assert (exercise_run / "exercises" / "rmsnorm.py").read_bytes() == source


def test_trace_of_the_run_uses_the_learners_module(cli, exercise_run, here):
    import minigpt

    run = minigpt.load(exercise_run)
    norms = [run.model.final_norm, *(m for b in run.model.blocks for m in (b.norm1, b.norm2))]
    assert len({type(n) for n in norms}) == 1  # the learner's class, at every norm
    assert type(norms[0]).__module__.startswith("minigpt_exercise_rmsnorm_")
    traced = cli("trace", "--run", exercise_run, "-p", "ROMEO", "--json")
    assert traced.exit_code == 0, traced.stderr

    # minigpt's own RMSNorm on the same weights: the same trace
    own = MiniGPT(replace(run.model.cfg, exercise="none"), run.model.vocab_size).eval()
    own.load_state_dict(run.model.state_dict())
    ids = torch.tensor([run.tokenizer.encode("ROMEO")])
    a, b = Recorder(run.model.cfg), Recorder(own.cfg)
    with torch.no_grad():
        run.model(ids, recorder=a)
        own(ids, recorder=b)
    assert all(torch.allclose(a[s], b[s], atol=1e-6) for s in b.stages)

    # A deliberately different module recorded for the same weights (an RMSNorm scaled by 2): the
    # trace, built from the recorded file, changes.
    other = here / "other"
    shutil.copytree(exercise_run, other)
    doubled = solve(
        here,
        "doubled",
        (SOLUTIONS / "rmsnorm.py").read_text().replace("self.weight * x / rms", "2 * self.weight * x / rms"),
    )
    for checkpoint in ("checkpoint.pt", "best.pt"):
        payload = torch.load(other / checkpoint, weights_only=True)
        payload["exercise"].update(file=str(doubled), sha256=hashlib.sha256(doubled.read_bytes()).hexdigest())
        torch.save(payload, other / checkpoint)
    traced_other = cli("trace", "--run", other, "-p", "ROMEO", "--json")
    assert traced_other.exit_code == 0, traced_other.stderr
    assert traced_other.stdout != traced.stdout
    import json

    before, after = json.loads(traced.stdout), json.loads(traced_other.stdout)
    row, doubled_row = before["blocks"][0]["stages"]["norm1"], after["blocks"][0]["stages"]["norm1"]
    assert doubled_row == pytest.approx([2 * v for v in row], rel=1e-6)


def test_a_changed_file_is_refused_by_name_by_every_command(cli, exercise_run, here):
    path = here / "exercises" / "rmsnorm.py"
    path.write_text(path.read_text() + "# tidied\n")
    for command in (
        ("trace", "--run", exercise_run, "-p", "ROMEO"),
        ("sample", "--run", exercise_run, "-n", "5"),
        ("eval", "--run", exercise_run, "--data", here / "tiny.txt"),
    ):
        refused = cli(*command)
        assert refused.exit_code == 2, command
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith("minigpt: error: the run run was trained with exercises/rmsnorm.py as it was then")
        assert line.endswith(
            "its weights belong to that code; restore it (the run folder keeps the file it was trained with: "
            "run/exercises/rmsnorm.py), or train a new run with the file as it is now"
        )
    resumed = cli("train", "-c", here / "tiny.toml", "--exercise", "rmsnorm", "--out", exercise_run, "--resume")
    assert resumed.exit_code == 2
    assert "--resume refused: exercises/rmsnorm.py has changed since this run was trained with it" in resumed.stderr
    path.unlink()
    missing = cli("trace", "--run", exercise_run, "-p", "ROMEO")
    assert missing.stderr.strip() == (
        "minigpt: error: the run run was trained with the learner's file exercises/rmsnorm.py, which is not there "
        "any more; put it back (the run folder keeps a copy: run/exercises/rmsnorm.py)"
    )


def test_a_block_runs_residual1_cannot_be_replaced_but_is_recorded(tmp_path):
    from minigpt.config import ModelConfig
    from minigpt.errors import MinigptError
    from minigpt.inspection.interventions import ReplaceResidual
    from minigpt.inspection.interventions_apply import replacements

    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=8, ffn_hidden=12, context=8, exercise="block")
    model = MiniGPT(cfg, 11, parts_of(read_learner("block", SOLUTIONS / "block.py"))).eval()
    recorder = Recorder(cfg, replacements([ReplaceResidual(0)], model, position=2))
    with pytest.raises(MinigptError, match="computes residual1 inside its own forward"):
        model(torch.tensor([[1, 2, 3]]), recorder=recorder)


def test_a_fine_tune_of_an_exercise_run_keeps_the_learners_module(cli, exercise_run, here):
    import minigpt

    tuned = cli("train", "-c", here / "tiny.toml", "--init-from", exercise_run, "--out", here / "tuned", "--steps", "5")
    assert tuned.exit_code == 0, tuned.stderr
    model = minigpt.load(here / "tuned").model
    assert model.cfg.exercise == "rmsnorm"
    assert type(model.final_norm).__module__.startswith("minigpt_exercise_rmsnorm_")
