"""Failpoints: named places in `minigpt train` where a test makes the real command sleep, say that
it got there, wait for the test's signal, or fail, through one environment variable. For tests
only: nothing in minigpt sets it, and unset, a point reached costs one dict lookup (the variable is
read once, at the first).

    MINIGPT_FAILPOINTS="batch=sleep:0.02"                  every training batch 20 ms slower
    MINIGPT_FAILPOINTS="batch@25=announce+sleep:30"        at the 25th batch: say so, then wait
    MINIGPT_FAILPOINTS="batch@7=announce+pause:60"         at the 7th: say so, wait for a signal
    MINIGPT_FAILPOINTS="checkpoint-write@4=raise:ENOSPC"   the 4th checkpoint write meets a full disk
    MINIGPT_FAILPOINTS="batch=raise"                       a RuntimeError: a bug, not a refusal

Entries are separated by ";". `POINT@N` acts the Nth time this process reaches POINT only, a plain
`POINT` every time. Its actions, joined by "+", run in order:

    sleep:SECONDS   sleep (pacing, or a wait in which the test kills the process); a signal
                    whose handler returns does not cut it short
    announce        append "POINT\\n" to the file MINIGPT_FAILPOINTS_FILE names
    pause:SECONDS   wait until a signal reaches one of the process's Python handlers, at most
                    SECONDS. Signals are watched for from the moment the point is reached, so one
                    sent as soon as the test reads an earlier `announce` of the trigger ends it:
                    the test signals the process at a moment it knows, not one it guesses
    raise           raise RuntimeError
    raise:ERRNO     raise OSError with that errno, as the system would (ENOSPC: a full disk)

An unknown point, action or number in the variable is refused (a MinigptError at the first point
reached), and `reach` of a point not in POINTS is an error: a renamed point breaks its tests
loudly instead of silently no longer pausing them.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import time
from dataclasses import dataclass

from .errors import MinigptError

VARIABLE = "MINIGPT_FAILPOINTS"
ANNOUNCE_FILE = "MINIGPT_FAILPOINTS_FILE"

# Every point and where the library reaches it (tests/test_failpoints.py holds the two together).
POINTS = {
    "tokenizer-fit": "text.corpus.load_corpus: the tokenizer is about to be fitted (no token cache entry)",
    "batch": "training.trainer.Trainer.train_step: a micro-batch has been drawn, before its forward pass",
    "eval": "training.trainer.evaluate: an evaluation begins",
    "checkpoint-write": (
        "runs.checkpoints.save_checkpoint: checkpoint.pt or best.pt is in its temporary file, not yet renamed"
    ),
    "metrics-open": "training.listeners.MetricsLog: metrics.jsonl is about to be opened (rewritten first on resume)",
    "train-end": (
        "api.training.train: training is over (done or stopped) and its session left, every rank out of the process "
        "group; train() is about to return"
    ),
}


@dataclass(frozen=True)
class Trigger:
    hit: int | None  # act only the Nth time the point is reached; None: every time
    actions: tuple[tuple[str, str], ...]  # (action, argument), in order


def parse(spec: str) -> dict[str, tuple[Trigger, ...]]:
    """Every point's triggers (none for a point the spec does not name)."""
    plan: dict[str, list[Trigger]] = {name: [] for name in POINTS}
    for entry in filter(None, (e.strip() for e in spec.split(";"))):
        where, equals, actions = entry.partition("=")
        name, at, hit = where.strip().partition("@")
        if name not in POINTS:
            raise _refused(entry, f"unknown point {name!r}; the points are {', '.join(POINTS)}")
        if not equals or not actions.strip():
            raise _refused(entry, "give actions after '=', e.g. batch=sleep:0.02")
        if at and not (hit.isdigit() and int(hit) >= 1):
            raise _refused(entry, f"@{hit} is not a hit count (1, 2, ...)")
        plan[name].append(Trigger(int(hit) if at else None, tuple(_action(entry, a) for a in actions.split("+"))))
    return {name: tuple(triggers) for name, triggers in plan.items()}


def _action(entry: str, text: str) -> tuple[str, str]:
    kind, _, argument = text.strip().partition(":")
    if kind in ("sleep", "pause"):
        try:
            if float(argument) >= 0:
                return kind, argument
        except ValueError:
            pass
        raise _refused(entry, f"{kind}:{argument} is not a number of seconds")
    if kind == "announce" and not argument:
        if not os.environ.get(ANNOUNCE_FILE):
            raise _refused(entry, f"announce needs {ANNOUNCE_FILE}, the file to append to")
        return kind, os.environ[ANNOUNCE_FILE]
    if kind == "raise" and (not argument or isinstance(getattr(errno, argument, None), int)):
        return kind, argument
    raise _refused(
        entry,
        f"unknown action {text.strip()!r}; the actions: sleep:SECONDS, announce, pause:SECONDS, raise, raise:ERRNO",
    )


def _refused(entry: str, why: str) -> MinigptError:
    return MinigptError(
        "{VARIABLE}: {entry!r}: {why} (see minigpt/failpoints.py)", VARIABLE=VARIABLE, entry=entry, why=why
    )


_armed: dict[str, tuple[Trigger, ...]] | None = None  # read from the environment at the first reach
_hits: dict[str, int] = {}


def reach(name: str) -> None:
    """The library is at point `name`: do what MINIGPT_FAILPOINTS says for it, if anything."""
    global _armed
    if _armed is None:
        _armed = parse(os.environ.get(VARIABLE, ""))
    try:
        triggers = _armed[name]
    except KeyError:
        raise LookupError(f"failpoints.reach({name!r}): no such point; the points are {', '.join(POINTS)}") from None
    if triggers:
        _fire(name, triggers)


def _fire(name: str, triggers: tuple[Trigger, ...]) -> None:
    hit = _hits[name] = _hits.get(name, 0) + 1
    for trigger in triggers:
        if trigger.hit not in (None, hit):
            continue
        signals = _Signals() if any(kind == "pause" for kind, _ in trigger.actions) else None
        try:
            for kind, argument in trigger.actions:
                if kind == "sleep":
                    time.sleep(float(argument))
                elif kind == "pause":
                    signals.wait(float(argument))
                elif kind == "announce":
                    with open(argument, "a", encoding="utf-8") as f:
                        f.write(name + "\n")
                elif argument:
                    code = getattr(errno, argument)
                    raise OSError(code, os.strerror(code))
                else:
                    raise RuntimeError(f"failpoint {name} reached ({VARIABLE} raise)")
        finally:
            if signals is not None:
                signals.close()


class _Signals:
    """The signals this process handles, from now on: Python writes a byte to a pipe for each
    (signal.set_wakeup_fd), so one that came before `wait` began is not missed. Main thread only."""

    def __init__(self) -> None:
        self.read, self.write = os.pipe()
        os.set_blocking(self.write, False)  # the handler must never block on a full pipe
        self.previous = signal.set_wakeup_fd(self.write)

    def wait(self, seconds: float) -> None:
        """Until a signal has come (since the last wait), at most `seconds`."""
        ready, _, _ = select.select([self.read], [], [], seconds)
        if ready:
            os.read(self.read, 4096)

    def close(self) -> None:
        signal.set_wakeup_fd(self.previous)
        os.close(self.read)
        os.close(self.write)
