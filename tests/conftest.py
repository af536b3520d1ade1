"""Shared fixtures: a session folder that holds every cache and setting a test run writes (never the
user's home), an isolated token cache for every test, a tiny config with a small text, and helpers
to run the CLI in-process (CliRunner) or as a real process (subprocess).

The suite runs on pytest-xdist's workers (`-n auto` in pyproject.toml; `-n 0` runs it in this one
process), each on one torch thread, with every process it starts on one thread too: two workers on
two cores then neither wait for each other nor slow each other's timing-free tests."""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE = REPO / "data" / "tinyshakespeare.txt"

# Where the programs a test run starts keep their caches and settings, pointed into the session
# folder: minigpt's token cache, matplotlib's font cache, Jupyter's and IPython's runtime files,
# Hugging Face's hub folder, and every XDG base folder (Chromium's profile, fontconfig's cache).
SESSION_FOLDERS = {
    "MINIGPT_CACHE": "minigpt-cache",
    "MPLCONFIGDIR": "matplotlib",
    "IPYTHONDIR": "ipython",
    "JUPYTER_CONFIG_DIR": "jupyter/config",
    "JUPYTER_DATA_DIR": "jupyter/data",
    "JUPYTER_RUNTIME_DIR": "jupyter/runtime",
    "HF_HOME": "huggingface",
    "XDG_CACHE_HOME": "xdg/cache",
    "XDG_CONFIG_HOME": "xdg/config",
    "XDG_DATA_HOME": "xdg/data",
    "XDG_STATE_HOME": "xdg/state",
}
SESSION_KEY = pytest.StashKey[Path]()


def pytest_configure(config):
    """Before any fixture runs, in every worker: the session folder, and one torch thread per worker."""
    folder = Path(tempfile.mkdtemp(prefix="minigpt-tests-"))
    config.stash[SESSION_KEY] = folder
    for name, sub in SESSION_FOLDERS.items():
        (folder / sub).mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(folder / sub)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"  # the processes a test starts: torchrun's ranks, servers, pages
        import torch

        torch.set_num_threads(1)


def pytest_unconfigure(config):
    folder = config.stash.get(SESSION_KEY, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per core this process may use, at most eight (each imports torch and
    collects the whole suite once)."""
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def need(name: str):
    """The module `name`, an extra the test extra installs (transformers, peft, onnxruntime, ...):
    without it the test skips, naming the pip line; in CI ($CI set) it fails, so that a CI run never
    passes with a part untested."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        reason = f"{name} is not installed ({exc}); pip install -e '.[test]' brings it"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


class lazy_module:  # noqa: N801 (read as a module)
    """A module imported (by need()) when a test first uses it, not when pytest collects the file:
    importing transformers, peft or onnxscript costs seconds, which every collection (each xdist
    worker's, the quick tier's, `pytest -k`'s) paid for every file that names one."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("_"):  # pytest's collection looks for markers and dunders on every name
            raise AttributeError(attr)
        return getattr(need(self._name), attr)


# Small enough that 20 steps take well under a second on one thread. Every choice `auto` would make
# by the machine is pinned (optimizer, threads, precision), so every CPU kind computes the same run;
# the tests of those choices ask for `auto` themselves.
TINY_CONFIG = """\
[model]
context = 8
n_layer = 1
n_head = 2
n_embd = 16
ffn_hidden = 32

[tokenizer]
kind = "char"

[train]
data = "tiny.txt"
optimizer = "adamw"
batch_size = 4
steps = 20
learning_rate = 3e-3
min_lr = 1e-4
warmup_steps = 2
eval_interval = 10
eval_batches = 2
checkpoint_interval = 10
log_interval = 5
threads = 1
device = "cpu"
precision = "float32"
"""


# A seeded random run folder, built without `minigpt train` (fast): for sampling and its runtimes.
CORPUS = "ROMEO: hello world, é日!\nJULIET: what light?\n"
CONTEXT = 8


def write_config(
    folder: Path,
    name: str = "tiny.toml",
    *,
    kind: str = "char",
    n_layer: int = 1,
    dtype: str = "float32",
    out: str = "run",
    sample: str = "",
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(
        f"""
[model]
context = {CONTEXT}
n_layer = {n_layer}
n_head = 2
n_embd = 16
ffn_hidden = 32
dtype = "{dtype}"
[tokenizer]
kind = "{kind}"
vocab_size = 300
[train]
out = "{out}"
device = "cpu"
[sample]
{sample}
""",
        encoding="utf-8",
    )
    return path


def make_run(
    folder: Path, *, kind: str = "char", n_layer: int = 1, dtype: str = "float32", seed: int = 0, sample: str = ""
) -> Path:
    """A config file and the run folder it names: a seeded random model with weights large enough
    that its distributions are far from uniform, and a tokenizer fitted to CORPUS."""
    import torch

    from minigpt.config import load_config
    from minigpt.model.gpt import MiniGPT
    from minigpt.runs.folder import write_model_run
    from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

    config = write_config(folder, kind=kind, n_layer=n_layer, dtype=dtype, sample=sample)
    cfg = load_config(config)
    tokenizer = TextTokenizer(train_tokenizer(kind, cfg.tokenizer.vocab_size, CORPUS))
    torch.manual_seed(seed)
    model = MiniGPT(cfg.model, tokenizer.vocab_size).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    write_model_run(cfg.run_dir, cfg, model, tokenizer)
    return config


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch) -> Path:
    """Every test gets its own token cache, so no test reads or writes ~/.cache/minigpt; and no
    failpoint set where the tests were started reaches a run (a test sets its own, per process)."""
    cache = tmp_path_factory.mktemp("minigpt-cache")
    monkeypatch.setenv("MINIGPT_CACHE", str(cache))
    monkeypatch.delenv("MINIGPT_FAILPOINTS", raising=False)
    monkeypatch.delenv("MINIGPT_FAILPOINTS_FILE", raising=False)
    return cache


@pytest.fixture
def tiny_text(tmp_path) -> Path:
    """The first 20,000 characters of the shipped Tiny Shakespeare (plain ASCII), as tiny.txt."""
    path = tmp_path / "tiny.txt"
    path.write_text(SHAKESPEARE.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    return path


@pytest.fixture
def tiny_config(tmp_path, tiny_text) -> Path:
    """tiny.toml next to tiny.txt (its data path is relative to the config's folder)."""
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_CONFIG, encoding="utf-8")
    return path


@pytest.fixture
def cli():
    """Run `minigpt ARGS` in-process; the result has .exit_code, .stdout, .stderr, .exception."""
    runner = CliRunner()

    def invoke(*args):
        from minigpt.cli import app

        return runner.invoke(app, [str(a) for a in args])

    return invoke


def refused(cli, *args) -> str:
    """A refusal: `minigpt ARGS` (run by the `cli` fixture) exits 2 with one line on stderr, no
    traceback; the line is returned."""
    result = cli(*args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minigpt: error: ") and "Traceback" not in result.output
    return lines[0]


def run_minigpt(*args, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """`python -m minigpt ARGS` as a real process (inherits MINIGPT_CACHE from the fixture)."""
    return subprocess.run(
        [sys.executable, "-m", "minigpt", *[str(a) for a in args]],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
        **kwargs,
    )


@pytest.fixture
def minigpt_process():
    return run_minigpt


def minigpt_command(*args) -> list[str]:
    """The real command line, `python -m minigpt ARGS`, for subprocess.Popen."""
    return [sys.executable, "-m", "minigpt", *[str(a) for a in args]]


def with_failpoints(spec: str, announce: Path | None = None, **extra: str) -> dict[str, str]:
    """The environment of a real minigpt process whose failpoints (minigpt/failpoints.py) do `spec`,
    appending to `announce` for each point reached with the `announce` action."""
    env = {**os.environ, "MINIGPT_FAILPOINTS": spec, **extra}
    if announce is not None:
        env["MINIGPT_FAILPOINTS_FILE"] = str(announce)
    return env


def wait_for(predicate, what: str, process: subprocess.Popen | None = None, seconds: float = 120) -> None:
    """Poll `predicate` until it holds; fail saying `what` after `seconds`, or as soon as `process`
    has ended (with its output)."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert process is None or process.poll() is None, (what, process.communicate())
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def announced(path: Path) -> list[str]:
    """The points a process announced so far (see with_failpoints), in order."""
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def train_tiny_run(folder: Path, *overrides: str) -> Path:
    """tiny.toml and tiny.txt in `folder`, trained in-process into folder/run (for module-scoped
    fixtures that share one small trained run)."""
    from minigpt.cli import app

    (folder / "tiny.txt").write_text(SHAKESPEARE.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    (folder / "tiny.toml").write_text(TINY_CONFIG, encoding="utf-8")
    result = CliRunner().invoke(
        app, ["train", "-c", str(folder / "tiny.toml"), "--out", str(folder / "run"), "--quiet", *overrides]
    )
    assert result.exit_code == 0, result.output
    return folder / "run"


def fine_tune_tiny_run(source: Path, out: Path, steps: int = 10) -> Path:
    """`minigpt train --init-from SOURCE` (a run train_tiny_run wrote) into `out`, in-process, on
    later Shakespeare in the characters SOURCE's char tokenizer knows."""
    from minigpt.cli import app
    from minigpt.text.tokenizer import TextTokenizer

    known = TextTokenizer.load(source / "tokenizer.json").alphabet
    text = out.parent / f"{out.name}.txt"
    text.write_text("".join(c for c in SHAKESPEARE.read_text(encoding="utf-8")[60_000:80_000] if c in known))
    # tiny.toml without its [model]: a fine-tune keeps the source's, whatever --set made it
    (out.parent / "tiny.toml").write_text(TINY_CONFIG[TINY_CONFIG.index("[tokenizer]") :], encoding="utf-8")
    result = CliRunner().invoke(
        app,
        ["train", "-c", str(out.parent / "tiny.toml"), "--init-from", str(source), "--data", str(text)]
        + ["--out", str(out), "--steps", str(steps), "--quiet"],
    )
    assert result.exit_code == 0, result.output
    return out


def interrupt_once_training(process: subprocess.Popen, there: Path, signum: int) -> str:
    """Wait until `process` has announced in `there` that it is paused at a training batch (its
    failpoints: `batch@N=announce+pause:SECONDS`), send it `signum`, which ends the pause there, and
    return its stderr once it has ended (it is killed if it has not, by then)."""
    try:
        wait_for(lambda: announced(there) == ["batch"], "training never reached its pause", process)
        process.send_signal(signum)
        return process.communicate(timeout=120)[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def child_processes(pid: int) -> list[int]:
    """The processes whose parent is `pid` (read from /proc, so no extra package is needed)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


class Numbered:
    """A tokenizer for a model built in a test: token i is the text `t{i}`; a prompt is such tokens
    separated by spaces."""

    def token_text(self, i: int) -> str:
        return f"t{i}"

    def encode(self, text: str, special: bool = True) -> list[int]:
        return [int(piece[1:]) for piece in text.split()]


def random_run(cfg, vocab: int, tokenizer, *, seed: int = 0, std: float = 0.5):
    """A Run of a seeded random model (every weight but the norms' drawn with `std`, so every part
    is far from zero) with the default config and `tokenizer`: for tests that need no run folder."""
    import torch

    from minigpt.api import Run
    from minigpt.config import load_config
    from minigpt.model.gpt import MiniGPT

    torch.manual_seed(seed)
    model = MiniGPT(cfg, vocab).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.normal_(0.0, std)
    return Run(Path("random"), load_config(REPO / "configs" / "default.toml"), model, tokenizer)


@contextlib.contextmanager
def power_cut_at(step: int):
    """Inside: writing the checkpoint of `step` fails as a power cut would (RuntimeError); the ones
    before it are written. For the tests that resume a run cut short after its last checkpoint."""
    from minigpt.runs import checkpoints

    real = checkpoints.save_checkpoint

    def save(path, payload):
        if payload["step"] == step:
            raise RuntimeError("simulated power cut")
        real(path, payload)

    checkpoints.save_checkpoint = save
    try:
        yield
    finally:
        checkpoints.save_checkpoint = real


def trained_and_resumed(folder: Path, *overrides: str) -> tuple[Path, Path]:
    """(straight, resumed): tiny.toml with `overrides` (--set values) trained 20 steps, and the same
    run cut short at the checkpoint of step 20 (a power cut) and resumed from step 10."""
    import torch

    from minigpt.cli import app

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.txt").write_text(SHAKESPEARE.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    (folder / "tiny.toml").write_text(TINY_CONFIG, encoding="utf-8")
    sets = [arg for o in overrides for arg in ("--set", o)]
    train = [*map(str, ["train", "-c", folder / "tiny.toml", "--quiet", *sets, "--out"])]
    straight, resumed = folder / "straight", folder / "resumed"
    result = CliRunner().invoke(app, [*train, str(straight)])
    assert result.exit_code == 0, result.output
    with power_cut_at(20):
        assert isinstance(CliRunner().invoke(app, [*train, str(resumed)]).exception, RuntimeError)
    assert torch.load(resumed / "checkpoint.pt", weights_only=True)["step"] == 10
    result = CliRunner().invoke(app, [*train, str(resumed), "--resume"])
    assert result.exit_code == 0, result.output
    return straight, resumed


@contextlib.contextmanager
def serving(run_dir: Path, *flags: str):
    """`minigpt explore --run RUN_DIR --port 0 FLAGS` as a real process: its address while it serves,
    then Ctrl-C, after which it must have stopped cleanly."""
    process = subprocess.Popen(
        [sys.executable, "-m", "minigpt", "explore", "--run", str(run_dir), "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
        # Ctrl-C as a terminal sends it: a suite started in the background (`.ci/run &`) starts its
        # children with SIGINT ignored, and Python then installs no KeyboardInterrupt for it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), (url, process.stderr.read() if process.poll() is not None else "")
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        assert process.returncode == 0 and "Traceback" not in stderr, stderr
        assert "minigpt explore: stopped" in stderr


@pytest.fixture
def one_thread():
    """torch on one thread for the test, as the tiny config trains (threads = 1): tiny matmuls only
    lose from a second thread. A module asks for it with pytestmark = usefixtures("one_thread")."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
