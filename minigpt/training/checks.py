"""What is checked of a new run before its folder is touched (session.py), beyond what its config
says of itself (config/cross_checks.py): what a config cannot train though a run of it can be read,
what the run reads (which its folder must stay apart from), and one forward pass of the model it
built, where what a model refuses only when it runs shows.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import Config
from ..device import autocast
from ..errors import MinigptError, Phrase
from ..text import sources


def check_trainable(cfg: Config, where: Phrase | None = None) -> None:
    """Refuse a config that can be read but not trained (`where`: the sweep's cell it is, if any). A
    sliding window shorter than the context is one: an imported Mistral's is (its context is how far
    rope was trained, and it reads texts within the window), but every window of a text a run trains
    on is `context` tokens long (a task's examples may be shorter: its first pass says)."""
    m = cfg.model
    if m.sliding_window and m.sliding_window < m.context and cfg.train.task == "none":
        raise MinigptError(
            ("{where}: " if where is not None else "")
            + "[model] sliding_window = {window} is shorter than [model] context = {context}, and a run trains on "
            "windows of context tokens, which the model does not read past its sliding window; set context to at "
            "most {window}, or sliding_window to {context} or more (0: none)",
            **({"where": where} if where is not None else {}),
            window=m.sliding_window,
            context=m.context,
        )


def check_first_pass(model: torch.nn.Module, windows: list[tuple[torch.Tensor, torch.Tensor]], precision: str) -> None:
    """One forward pass of the widest validation row, as the first step and evaluation will make,
    before anything is written: what a model refuses (or fails at) only when it runs, such as a row
    longer than its sliding window or a rope scaling it cannot compute, stops the run here, with its
    folder untouched, not after a step-0 checkpoint has replaced the run that was there. In eval
    mode, without gradients and with the RNG states put back, so the run computes what it would have."""
    x, y = max(windows, key=lambda batch: batch[0].shape[1])
    training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[x.device] if x.is_cuda else []), torch.no_grad():
            with autocast(str(x.device), precision):
                model(x[:1], y[:1])
    finally:
        model.train(training)


def read_sources(cfg: Config) -> list[tuple[str, Path]]:
    """What a new run reads, which its folder must neither be, hold nor lie inside: the run it
    fine-tunes, its training text (files and folders), the learner's file of its exercise, its config
    file."""
    tc = cfg.train
    found = [("the run it starts from", Path(tc.init_from))] if tc.init_from else []
    if tc.task == "none":
        found += [("the training data", Path(path)) for path in sources.entries(tc.data)]
    if cfg.model.exercise and tc.exercise_file:
        found.append(("the exercise's file", Path(tc.exercise_file)))
    if _names_a_file(cfg.source):
        found.append(("the config file", Path(cfg.source)))
    return found


def _names_a_file(source: str) -> bool:
    """Whether a config's `source` is a file (it may be "<defaults>", or a description too long
    for a file name)."""
    try:
        return Path(source).is_file()
    except OSError:
        return False
