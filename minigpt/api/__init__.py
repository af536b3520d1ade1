"""The Python API, the layer the commands stand on: training a run, and a run opened for reading.

    result = minigpt.train(data="my.txt", out="runs/mine", steps=200, set={"model.n_layer": 2})
    minigpt.train(data="books/", out="runs/books")      # every *.txt under a folder (or a list of paths)
    run = minigpt.load("runs/default")                 # or checkpoint="best"
    run.sample("ROMEO:", max_new_tokens=100, seed=1)    # the text; num_samples=3 gives a list
    run.trace("ROMEO:")                                 # a Trace, as `minigpt trace --json` prints
    run.trace("ROMEO:", grad=True).gradient             # d loss / d row of every stage, as `trace --grad`
    run.trace("ROMEO:", scale={"0.attention": 0.0})     # a Comparison, as `trace --compare`
    run.trace("ROMEO:", compare_run="origin")           # what fine-tuning changed: its origin run, then it
    run.trace(TraceRequest(prompt="ROMEO:", grad=True)) # the same question as one value (what the command builds)
    run.attribute("ROMEO:", " the", versus=" a")        # the logit difference as a sum of parts
    run.patch("ROMEO: I", "JULIET: I", " am", " will")  # activation patching between two prompts
    run.eval("my.txt")                                  # Scores: bits per byte, perplexity, surprisal
    run.read_with(extrapolate=True)                     # a rope/alibi/none model read past its context
    run.loss_by_position("my.txt", length=128)          # PositionLosses: the loss at each position
    run.accuracy()                                      # a task run's held-out exact-match accuracy
    run.export("safetensors", "out/")                   # or "hf": a GPT-2 folder transformers loads
    minigpt.api.import_hf("gpt2/", "runs/gpt2")         # a GPT-2 folder (or import_nanogpt) as a run
    minigpt.api.metrics("runs/mine")                    # the metrics log: training and evaluation records
    minigpt.sweep(["model.n_layer=2,4"], "runs/depth")  # a run per grid cell, resumable (sweep.py)
    minigpt.api.read_sweep("runs/depth").rows()         # its table: losses, divergence, wall time, optimizer

Refusals are `MinigptError`s with the messages the command line prints (parameters named as the
arguments here, where the command line names its flags); nothing here prints or exits. The command
line stands on this package alone (and on the text and picture renderers of minigpt.inspection), so
the errors a caller may catch are importable from here too, and so are the checks of an output
file (`check_output`, `write_output`: what `--png` and `plot -o` may write). A method
computes where `[train] device` says, on `[train] threads` threads: one for a single sample and for
a trace when threads is 0, as the commands do, since their matmuls are too small to share.
"""

from __future__ import annotations

from ..errors import MinigptError
from ..inspection.accuracy import Accuracy
from ..inspection.attribution import Attribution
from ..inspection.by_position import PositionLosses
from ..inspection.comparison import Comparison
from ..inspection.patching import Patching
from ..inspection.scoring import Scores
from ..inspection.trace import Trace
from ..runs.outputs import JSON_LINES, PNG, check_output, write_output
from ..training.distributed import RankLost, RefusedElsewhere, speaks
from ..training.trainer import DivergedError, TrainResult, WriteFailed, estimate_seconds
from .interchange import check_export, export, import_hf, import_nanogpt
from .reading import metrics, read_prompt
from .run import SAMPLE_SETTINGS, Run, load
from .sweep import Sweep, read_sweep, sweep
from .trace_request import TraceRequest
from .training import train

__all__ = [
    "JSON_LINES",
    "PNG",
    "SAMPLE_SETTINGS",
    "Accuracy",
    "Attribution",
    "Comparison",
    "DivergedError",
    "MinigptError",
    "Patching",
    "PositionLosses",
    "RankLost",
    "RefusedElsewhere",
    "Run",
    "Scores",
    "Sweep",
    "Trace",
    "TraceRequest",
    "TrainResult",
    "WriteFailed",
    "check_export",
    "check_output",
    "estimate_seconds",
    "export",
    "import_hf",
    "import_nanogpt",
    "load",
    "metrics",
    "read_prompt",
    "read_sweep",
    "speaks",
    "sweep",
    "train",
    "write_output",
]
