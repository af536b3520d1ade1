"""Past the position table, the window's forward on onnxruntime (`[sample] runtime = "onnxruntime"`,
the `onnx` extra).

Past the table every new token recomputes the whole window (generate.py says why). At the default
shape that forward is some 70 small operations, and torch's cost per operation (dispatch, checks,
an output allocated each time) is larger than their arithmetic. onnxruntime runs the same
computation as one planned graph with fused kernels and reused buffers.

The graph is not written here: torch's ONNX exporter (torch.export) captures the folded model's own forward
(`MiniGPT.forward(last_only=True)` on fold.py's copy, as the torch path runs it) at the window's
fixed shape, [samples, context] ids -> [samples, vocabulary] scores. So it is the same model up to
float32 rounding (tested against the torch path: the same scores within 1e-4, the same tokens).
The exported file is cached under $MINIGPT_CACHE/onnx, named by a hash of the weights, the shape
and the torch version, so a run pays the export (some seconds) once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import tempfile
import warnings
from pathlib import Path

import torch
from torch import Tensor

from ..errors import MinigptError
from ..model.gpt import MiniGPT
from ..model.reading import Reading
from ..text.token_cache import cache_root

EXTRA = 'pip install "minigpt[onnx]"  (or: pip install onnxruntime onnxscript onnx)'
FORMAT = 1  # bump when the exported graph's inputs or outputs change: old cache files are not read


def require() -> None:
    """Refuse `runtime = "onnxruntime"` where the packages are missing, before any work. Found, not
    imported: onnxscript alone takes a second to import, and only an export needs it and onnx."""
    try:
        import onnxruntime  # noqa: F401  (light, unlike onnxscript)

        missing = [name for name in ("onnxscript", "onnx") if importlib.util.find_spec(name) is None]
    except ImportError:
        missing = ["onnxruntime"]
    if missing:
        raise MinigptError(
            '[sample] runtime = "onnxruntime" needs onnxruntime, onnxscript and onnx, which are not all '
            'installed; {EXTRA}; or use runtime = "torch"',
            EXTRA=EXTRA,
        ) from None


class _LastScores(torch.nn.Module):
    """What the torch path computes for a full window: the last position's scores."""

    def __init__(self, model: MiniGPT, reading: Reading):
        super().__init__()
        self.model, self.reading = model, reading

    def forward(self, ids: Tensor) -> Tensor:
        return self.model(ids, last_only=True, reading=self.reading)[0][:, -1]


def _key(model: MiniGPT, samples: int, reading: Reading) -> str:
    # the rope scaling it is read with turns the keys and queries: part of what the graph computes
    # (the model's own rule is its [model] section's)
    what = (FORMAT, torch.__version__, samples, model.context, model.cfg, str(reading.user_rule))
    digest = hashlib.sha256(repr(what).encode())
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:32]


def _export(model: MiniGPT, samples: int, reading: Reading, path: Path) -> None:
    """Trace and write the graph to `path`, whole or not at all (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = torch.zeros(samples, model.context, dtype=torch.long)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(handle)
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    try:
        # The exporter's notes on the graph it builds (operators it skips, versions it picks) are
        # logged and warned: nothing a user can act on, so only its errors are shown.
        exporter_log.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _LastScores(model, reading).eval(),
                (ids,),
                temporary,
                input_names=["ids"],
                output_names=["scores"],
                opset_version=18,  # the exporter's own: no conversion pass
                dynamo=True,  # torch.export's graph: sizes stay ints, as in the eager forward
                external_data=False,  # one file, whatever the size
                verbose=False,
            )
        os.replace(temporary, path)
    finally:
        exporter_log.setLevel(level)
        if os.path.exists(temporary):
            os.unlink(temporary)


class WindowRuntime:
    """The window's forward of `model` (the folded copy) read as `reading` says, for `samples` rows,
    on onnxruntime with as many threads as torch has been given (one for a single sample)."""

    def __init__(self, model: MiniGPT, samples: int, reading: Reading | None = None):
        require()
        reading = model.reading if reading is None else reading
        import onnxruntime

        if next(model.parameters()).device.type != "cpu":
            raise MinigptError(
                '[sample] runtime = "onnxruntime" runs on the CPU, and this model is on {device}; use runtime = '
                '"torch" there',
                device=next(model.parameters()).device,
            )
        path = cache_root() / "onnx" / f"{_key(model, samples, reading)}.onnx"
        if not path.is_file():
            with torch.inference_mode(False), torch.no_grad():
                _export(model, samples, reading, path)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only
        self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.context, self.samples = model.context, samples

    def __call__(self, window: Tensor) -> Tensor:
        """[samples, context] ids -> [samples, vocabulary] float32 scores of the last position."""
        ids = window.contiguous().numpy()
        return torch.from_numpy(self.session.run(None, {"ids": ids})[0])
