"""The failpoints the process-level tests pace, pause and fail the real CLI with
(minigpt/failpoints.py): their grammar, what each action does, that every point named in POINTS is
reached exactly once in the library (read from the source, so a renamed point breaks here), and
that a misspelt point in MINIGPT_FAILPOINTS stops a run with one line instead of being ignored."""

from __future__ import annotations

import ast
import errno
import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from minigpt import failpoints
from minigpt.errors import MinigptError

PACKAGE = Path(failpoints.__file__).resolve().parent


@pytest.fixture
def armed(monkeypatch):
    """Arm this process's failpoints with `spec` (as if read from the environment); put back after."""
    monkeypatch.setattr(failpoints, "_hits", {})

    def arm(spec: str) -> None:
        monkeypatch.setattr(failpoints, "_armed", failpoints.parse(spec))

    return arm


def test_an_empty_or_unset_variable_arms_nothing():
    assert failpoints.parse("") == {name: () for name in failpoints.POINTS}
    assert failpoints.parse(" ; ") == {name: () for name in failpoints.POINTS}


def test_entries_hits_and_actions_are_read_in_order(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGPT_FAILPOINTS_FILE", str(tmp_path / "reached"))
    plan = failpoints.parse(
        "batch@25=announce+sleep:30; eval=sleep:0.5;checkpoint-write@4=raise:ENOSPC;train-end=announce+pause:60"
    )
    assert plan["batch"] == (failpoints.Trigger(25, (("announce", str(tmp_path / "reached")), ("sleep", "30"))),)
    assert plan["eval"] == (failpoints.Trigger(None, (("sleep", "0.5"),)),)
    assert plan["checkpoint-write"] == (failpoints.Trigger(4, (("raise", "ENOSPC"),)),)
    assert plan["train-end"] == (failpoints.Trigger(None, (("announce", str(tmp_path / "reached")), ("pause", "60"))),)
    assert plan["metrics-open"] == plan["tokenizer-fit"] == ()


@pytest.mark.parametrize(
    "spec, said",
    [
        ("step=raise", "'step=raise': unknown point 'step'; the points are tokenizer-fit, batch, eval,"),
        ("batch", "'batch': give actions after '='"),
        ("batch=", "'batch=': give actions after '='"),
        ("batch@0=raise", "@0 is not a hit count"),
        ("batch@x=raise", "@x is not a hit count"),
        ("batch=sleep:soon", "sleep:soon is not a number of seconds"),
        ("batch=sleep:-1", "sleep:-1 is not a number of seconds"),
        ("batch=pause:later", "pause:later is not a number of seconds"),
        ("batch=explode", "unknown action 'explode'"),
        ("batch=raise:ENOTANERRNO", "unknown action 'raise:ENOTANERRNO'"),
        ("batch=announce", "announce needs MINIGPT_FAILPOINTS_FILE"),
    ],
)
def test_a_mistake_in_the_variable_is_refused_naming_the_entry(spec, said):
    with pytest.raises(MinigptError) as refused:
        failpoints.parse(spec)
    assert str(refused.value).startswith("MINIGPT_FAILPOINTS: ") and said in str(refused.value), refused.value


def test_reach_does_what_the_entry_says_at_the_hit_it_names(armed, tmp_path, monkeypatch):
    there = tmp_path / "reached"
    monkeypatch.setenv("MINIGPT_FAILPOINTS_FILE", str(there))
    armed("eval@2=announce+raise:ENOSPC;batch=sleep:0.05;tokenizer-fit=raise")
    failpoints.reach("eval")  # the first evaluation: nothing
    assert not there.exists()
    with pytest.raises(OSError) as full:
        failpoints.reach("eval")
    assert (full.value.errno, full.value.strerror) == (errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert there.read_text(encoding="utf-8") == "eval\n"  # announced before it raised
    failpoints.reach("eval")  # the third: nothing again
    started = time.perf_counter()
    failpoints.reach("batch")
    assert time.perf_counter() - started >= 0.05
    with pytest.raises(RuntimeError, match=r"^failpoint tokenizer-fit reached \(MINIGPT_FAILPOINTS raise\)$"):
        failpoints.reach("tokenizer-fit")
    failpoints.reach("metrics-open")  # not named: nothing
    assert there.read_text(encoding="utf-8") == "eval\n"


@pytest.fixture
def usr1():
    """SIGUSR1 handled in this process, its arrivals counted (the handler put back after)."""
    got: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    yield got
    signal.signal(signal.SIGUSR1, previous)


def test_pause_ends_at_a_signal_sent_once_the_announcement_is_read(armed, tmp_path, monkeypatch, usr1):
    there = tmp_path / "reached"
    monkeypatch.setenv("MINIGPT_FAILPOINTS_FILE", str(there))
    armed("eval=announce+pause:60")

    def test_process():  # what a test does: wait for the line, then signal
        while not there.exists():
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGUSR1)

    sender = threading.Thread(target=test_process)
    sender.start()
    started = time.monotonic()
    failpoints.reach("eval")
    sender.join()
    assert usr1 == [signal.SIGUSR1] and time.monotonic() - started < 30
    assert signal.set_wakeup_fd(-1) == -1  # nothing of the pause's is left watching


def test_a_signal_that_comes_before_the_pause_begins_ends_it_too(armed, monkeypatch, usr1):
    # The signal arrives between the point being reached and its pause (here: during a sleep before
    # it, the widest such gap): the pause must not wait for another one.
    armed("eval=sleep:0+pause:60")
    monkeypatch.setattr(failpoints, "time", SimpleNamespace(sleep=lambda seconds: signal.raise_signal(signal.SIGUSR1)))
    started = time.monotonic()
    failpoints.reach("eval")
    assert usr1 == [signal.SIGUSR1] and time.monotonic() - started < 30


def test_a_pause_without_a_signal_lasts_its_seconds(armed):
    armed("eval=pause:0.05")
    started = time.monotonic()
    failpoints.reach("eval")
    assert time.monotonic() - started >= 0.05


def test_reaching_a_point_that_does_not_exist_is_an_error_even_unarmed(armed):
    armed("")
    with pytest.raises(LookupError, match=r"failpoints.reach\('step'\): no such point"):
        failpoints.reach("step")


def reached_points() -> dict[str, list[str]]:
    """Every `failpoints.reach("NAME")` in the package: NAME -> the modules that reach it (dotted, below minigpt)."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "reach"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "failpoints"
            ):
                [argument] = node.args
                assert isinstance(argument, ast.Constant), f"{path.name}: reach() takes a point's name as written"
                found.setdefault(argument.value, []).append(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
    return found


def test_every_point_is_reached_once_in_the_module_its_description_names():
    found = reached_points()
    assert sorted(found) == sorted(failpoints.POINTS)
    for name, where in failpoints.POINTS.items():
        [module] = found[name]
        assert where.partition(":")[0].startswith(module + "."), (name, module)


def test_a_misspelt_point_in_the_environment_stops_the_run_in_one_line(cli, tiny_config, tmp_path, monkeypatch):
    monkeypatch.setattr(failpoints, "_armed", None)  # read the variable again, as a new process does
    monkeypatch.setenv("MINIGPT_FAILPOINTS", "bacth=sleep:0.02")
    result = cli("train", "-c", tiny_config, "--out", tmp_path / "run", "--quiet")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("minigpt: error: MINIGPT_FAILPOINTS: 'bacth=sleep:0.02': unknown point 'bacth'")
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "run").exists()
