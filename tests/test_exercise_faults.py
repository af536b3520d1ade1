"""A learner's code that exits, dies, hangs or fails only at a run's own shapes is the file's fault,
said in one line naming the file (and its line), never a silent exit 0 and never a run folder left
behind (issue 44, parts 6 to 8). `exercise check`, and the check `train --exercise` runs first, run
the code in a child process with a time limit on each step (MINIGPT_CHECK_SECONDS, 30 s unless set;
1 s here); training then runs the model once at the run's own batch before anything is written."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from conftest import child_processes, minigpt_command, wait_for
from learner_files import ffn_returning, files_under, line_of, solution, write_learner

RETURN = "return self.W2(F.relu(self.W1(x)))"
OUT = "out = self.W2(F.relu(self.W1(x)))"
ENDS = (
    "a module returns its result, or raises an Exception that says what is wrong, and never exits; remove that, "
    "then try again"
)


@pytest.fixture
def here(tmp_path, tiny_config, monkeypatch):
    """The learner's folder, with tiny.toml and tiny.txt in it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def one_line(result, code: int) -> str:
    """What a command said, in one line on stderr, exiting `code`, nothing on stdout, no traceback."""
    stderr = result.stderr if isinstance(result.stderr, str) else ""
    code_seen = result.returncode if hasattr(result, "returncode") else result.exit_code
    assert code_seen == code, (code_seen, result.stdout, stderr)
    assert result.stdout == "" and "Traceback" not in stderr
    [line] = stderr.splitlines()
    return line


ENDINGS = {
    "sys.exit": ("import sys\nsys.exit(0)", "sys.exit(0)", "SystemExit: 0"),
    "os._exit": ("import os\nos._exit(0)", "os._exit(0)", "os._exit(0)"),
    "a BaseException": ("raise GeneratorExit('done')", "GeneratorExit", "GeneratorExit: done"),
    "KeyboardInterrupt raised by the code": ("raise KeyboardInterrupt", "raise KeyboardInterrupt", "KeyboardInterrupt"),
}


@pytest.mark.slow  # real processes, two for each way to end
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_code_that_ends_the_program_is_the_files_fault_at_check_and_at_train(minigpt_process, here, ending):
    body, call, said = ENDINGS[ending]
    path = write_learner(here, ffn_returning(body))
    before = files_under(here)
    expected = (
        f"minigpt: error: exercises/ffn.py tried to end the program at line {line_of(path, call)} ({said}) while it "
        f"was checked: {ENDS}"
    )
    # real processes: the code runs in a child whatever it does, and this one must say so, exit 1
    assert one_line(minigpt_process("exercise", "check", "ffn", cwd=here), 1) == expected
    trained = minigpt_process("train", "-c", "tiny.toml", "--exercise", "ffn", "--quiet", "--out", "run", cwd=here)
    assert one_line(trained, 1) == expected
    assert files_under(here) == before  # no run folder, nothing changed


def test_a_file_that_exits_while_imported_names_its_line(cli, here):
    path = write_learner(here, "import sys\nsys.exit(3)\n" + solution("ffn"))
    assert one_line(cli("exercise", "check", "ffn"), 1) == (
        f"minigpt: error: exercises/ffn.py tried to end the program at line {line_of(path, 'sys.exit')} "
        f"(SystemExit: 3) while it was imported: {ENDS}"
    )


@pytest.mark.slow  # waits out a time limit in a child process, twice for each command
@pytest.mark.parametrize("where", ["forward", "import"])
def test_a_hang_is_stopped_at_the_time_limit_naming_the_line(cli, here, where, monkeypatch):
    monkeypatch.setenv("MINIGPT_CHECK_SECONDS", "1")  # one second for each step of a check
    loop = "while True:\n    pass"
    path = write_learner(here, ffn_returning(loop) if where == "forward" else loop + "\n" + solution("ffn"))
    before = files_under(here)
    during = "checking that FeedForward returns the model's width" if where == "forward" else "importing it"
    at = line_of(path, "while True")  # or the line of its `pass`: where the loop was when the time ran out
    for command in (("exercise", "check", "ffn"), ("train", "-c", "tiny.toml", "--exercise", "ffn", "--out", "run")):
        started = time.monotonic()
        line = one_line(cli(*command), 1)
        assert time.monotonic() - started < 60
        assert any(
            line.startswith(f"minigpt: error: exercises/ffn.py did not return within 1 s at line {n}, while {during}")
            for n in (at, at + 1)
        ), line
        assert line.endswith(
            "; 1 s is the time limit of each step of a check (MINIGPT_CHECK_SECONDS sets another), and a check runs "
            "the module on a few small tensors in far less: look there for a loop that never ends, or for code that "
            "waits"
        )
    assert files_under(here) == before


@pytest.mark.slow  # a child process killed by a real signal
def test_code_that_kills_the_process_checking_it_is_the_files_fault(cli, here):
    write_learner(here, ffn_returning("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"))
    assert one_line(cli("exercise", "check", "ffn"), 1).startswith(
        "minigpt: error: exercises/ffn.py ended the process that checked it (killed by SIGKILL) while checking "
        "that FeedForward returns the model's width"
    )


@pytest.mark.slow  # a real process, a real signal
def test_ctrl_c_still_stops_a_check_and_its_child(here, monkeypatch):
    monkeypatch.setenv("MINIGPT_CHECK_SECONDS", "120")
    write_learner(here, ffn_returning("while True:\n    pass"))
    process = subprocess.Popen(
        minigpt_command("exercise", "check", "ffn"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as a terminal sends it (a suite started in the background starts its children ignoring it)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        wait_for(lambda: child_processes(process.pid), "the check never started its child", process)
        [child] = child_processes(process.pid)
        time.sleep(1)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert (process.returncode, stdout, stderr) == (130, "", "minigpt: interrupted\n")
    wait_for(lambda: not os.path.exists(f"/proc/{child}") or _zombie(child), "the child outlived the check")


def _zombie(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


# ---------------------------------------------------------------- at the run's own shapes


def _train(cli):
    return cli("train", "-c", "tiny.toml", "--exercise", "ffn", "--quiet", "--out", "run", "--steps", "10")


# Each passes every check (their batches have 2 rows); the run's have 4. {line}: the line of sys.exit.
AT_THE_RUNS_BATCH = {
    "a wrong shape": (
        f"{OUT}\nreturn out[..., :-1] if x.shape[0] >= 4 else out",
        2,
        "minigpt: error: exercises/ffn.py passes its checks, but a model with it fails on a training batch of this "
        "run, [4, 8]: ResidualShapeError: residual add needs equal shapes, got [4, 8, 16] + [4, 8, 15]; "
        "broadcasting would reuse one update for many rows; the checks use small inputs: make it work for any batch "
        "size and length, then train again",
    ),
    "an exit": (
        f"if x.shape[0] >= 4:\n    import sys\n    sys.exit(0)\n{RETURN}",
        1,
        "minigpt: error: exercises/ffn.py tried to end the program at line {line} (SystemExit: 0) while the model "
        f"ran it: {ENDS}",
    ),
    # os._exit cannot be caught, and in this process, where the model runs, it ends nothing either
    "an os._exit": (
        f"if x.shape[0] >= 4:\n    import os\n    os._exit(0)\n{RETURN}",
        1,
        "minigpt: error: exercises/ffn.py tried to end the program at line {line} (os._exit(0)) while the model "
        f"ran it: {ENDS}",
    ),
    "a NaN": (
        f"{OUT}\nreturn out * float('nan') if x.shape[0] >= 4 else out",
        2,
        "minigpt: error: exercises/ffn.py passes its checks, but a model with it gives a loss of nan on a training "
        "batch of this run, [4, 8], before any step (so no learning rate made it): look in it for what makes a NaN "
        "or inf (a division by zero, the square root or log of a negative number, an exp that overflows)",
    ),
}


@pytest.mark.parametrize("fault", list(AT_THE_RUNS_BATCH))
def test_a_module_failing_only_at_the_runs_batch_is_said_before_anything_is_written(cli, here, fault):
    body, code, expected = AT_THE_RUNS_BATCH[fault]
    path = write_learner(here, ffn_returning(body))
    before = files_under(here)
    line = next((line_of(path, call) for call in ("sys.exit", "os._exit") if call in body), None)
    assert one_line(_train(cli), code) == expected.replace("{line}", str(line))
    assert files_under(here) == before


def test_a_divergence_of_a_model_with_a_learners_module_points_at_its_file_first(cli, here):
    # NaN from its third call on a training batch: the step after the first
    counted = f"FeedForward.calls = getattr(FeedForward, 'calls', 0) + (x.shape[0] >= 4)\n{OUT}"
    write_learner(here, ffn_returning(f"{counted}\nreturn out * float('nan') if FeedForward.calls >= 3 else out"))
    line = one_line(_train(cli), 1)
    assert line.startswith("minigpt: error: step 2's loss or gradient is not finite (loss nan, gradient norm nan)")
    first, then = "The model runs the learner's file exercises/ffn.py (exercise ffn): look there first", "Lower train"
    assert first in line and then in line and line.index(first) < line.index(then)


@pytest.mark.parametrize("ending, said", [("sys.exit(0)", "SystemExit: 0"), ("os._exit(0)", "os._exit(0)")])
def test_a_module_that_exits_while_a_reading_runs_it_is_the_files_fault(cli, here, monkeypatch, ending, said):
    exits = f"import os, sys\nif os.environ.get('LEARNER_EXITS'):\n    {ending}\n{RETURN}"
    path = write_learner(here, ffn_returning(exits))
    assert _train(cli).exit_code == 0
    monkeypatch.setenv("LEARNER_EXITS", "1")
    sampled = cli("sample", "--run", "run", "-n", "3")
    assert sampled.exit_code == 1
    assert sampled.stderr.splitlines()[-1] == (
        f"minigpt: error: exercises/ffn.py tried to end the program at line {line_of(path, ending)} "
        f"({said}) while the model ran it: {ENDS}"
    )


def test_the_python_api_checks_in_a_child_process_too(here):
    from minigpt.api import exercises

    path = write_learner(here, ffn_returning("import sys\nsys.exit(0)"))
    with pytest.raises(exercises.LearnerFault, match=rf"at line {line_of(path, 'sys.exit')} \(SystemExit: 0\)"):
        exercises.check("ffn")
    write_learner(here, solution("ffn"))
    assert exercises.check("ffn", seconds=10).passed


@pytest.mark.parametrize("given", ["soon", "0", "-1", "nan", "inf", "1e12", "86401"])
def test_a_time_limit_that_is_not_a_number_of_seconds_is_refused(cli, here, monkeypatch, given):
    write_learner(here, solution("ffn"))
    monkeypatch.setenv("MINIGPT_CHECK_SECONDS", given)
    assert one_line(cli("exercise", "check", "ffn"), 2) == (
        f"minigpt: error: MINIGPT_CHECK_SECONDS={given} is not a number of seconds from 0 to 86400 (a day); give one "
        "(the default is 30)"
    )
