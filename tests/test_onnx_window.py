"""[sample] runtime = "onnxruntime" (onnx_window.py): past the position table the window's forward
runs on onnxruntime, from the graph torch's exporter captures of the folded model's own forward. The
reference is the torch path of the same Generation: the same scores within float32 rounding, the
same tokens. Skipped where the onnx extra is not installed (it is in the test extra)."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import make_run, need
from typer.testing import CliRunner

from minigpt.cli import app
from minigpt.config import SampleConfig, load_config
from minigpt.model.fold import fold_norms
from minigpt.model.gpt import MiniGPT
from minigpt.sampling import onnx_window
from minigpt.sampling.generate import generate


@pytest.fixture(autouse=True, scope="module")
def onnx_extra():
    """The onnx extra (in the test extra), imported when the first test here runs."""
    need("onnxruntime")
    need("onnxscript")


SHAPE = [
    "model.context=8",
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=16",
    "model.ffn_hidden=32",
]


def model_of(*changes: str, seed: int = 0) -> MiniGPT:
    cfg = load_config(None, [*SHAPE, *changes])
    torch.manual_seed(seed)
    model = MiniGPT(cfg.model, 40).eval()
    with torch.no_grad():  # weights far from their initial scale: distributions far from uniform
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    return model


@pytest.mark.parametrize(
    "changes",
    [
        [],
        ['model.activation="gelu"', 'model.norm="rmsnorm"', "model.bias=false", "model.tie_embeddings=true"],
    ],
    ids=["layernorm-relu", "rmsnorm-gelu-tied"],
)
def test_the_runtime_scores_a_window_as_the_torch_path_does(changes):
    folded = fold_norms(model_of(*changes))
    runtime = onnx_window.WindowRuntime(folded, 2)
    windows = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        expected = folded(windows, last_only=True)[0][:, -1]
        got = runtime(windows)
    assert got.shape == (2, 40) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)
    assert (expected - expected.mean()).abs().max() > 1.0  # scores that differ, not a flat row


@pytest.mark.parametrize("greedy", [True, False])
def test_sampling_past_the_table_draws_the_same_tokens(greedy):
    model = model_of()

    def tokens(runtime: str) -> list[int]:
        settings = SampleConfig(max_new_tokens=40, temperature=1.0, greedy=greedy, num_samples=2, runtime=runtime)
        generation = generate(
            model, [1, 2, 3], settings, generator=torch.Generator().manual_seed(7)
        )  # 35 past the table
        return torch.stack([step.tokens for step in generation]).tolist()

    assert tokens("onnxruntime") == tokens("torch")


def test_the_export_is_cached_and_keyed_by_the_weights(monkeypatch, isolated_cache):
    folded = fold_norms(model_of())
    onnx_window.WindowRuntime(folded, 1)
    assert len(list((isolated_cache / "onnx").glob("*.onnx"))) == 1
    assert not list((isolated_cache / "onnx").glob("*.tmp"))  # nothing half-written left behind

    def no_export(*args):
        raise AssertionError("exported again")

    monkeypatch.setattr(onnx_window, "_export", no_export)
    onnx_window.WindowRuntime(folded, 1)  # the same weights: read from the cache
    with pytest.raises(AssertionError, match="exported again"):
        onnx_window.WindowRuntime(fold_norms(model_of(seed=1)), 1)  # other weights: another graph


@pytest.mark.slow  # seconds of real work: the full suite (and .ci/run) runs it
def test_minigpt_sample_with_the_runtime_prints_what_torch_prints_and_nothing_else(tmp_path, minigpt_process):
    # real processes: the exporter logs through torch's own handlers, which only a process's real
    # stderr shows; the first call exports (nothing of it may reach the user), the second reads the cache
    config = make_run(tmp_path)
    args = ["sample", "-c", config, "-p", "ROMEO:", "-n", "30"]
    torch_text = minigpt_process(*args)
    for _ in range(2):
        onnx_text = minigpt_process(*args, "--runtime", "onnxruntime")
        said = onnx_text.stderr.splitlines()  # the command's own summary line, and nothing of the export
        assert onnx_text.returncode == 0 and len(said) == 1 and said[0].startswith("minigpt: 1 sample, 30 new tokens")
        assert onnx_text.stdout == torch_text.stdout and len(torch_text.stdout) > 30


def test_a_missing_extra_is_refused_in_one_line_naming_the_install(tmp_path, monkeypatch):
    config = make_run(tmp_path)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now fails
    result = CliRunner().invoke(app, ["sample", "-c", str(config), "-n", "20", "--runtime", "onnxruntime"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert 'pip install "minigpt[onnx]"' in result.stderr and 'runtime = "torch"' in result.stderr


def test_an_unknown_runtime_is_refused_naming_the_choices(tmp_path):
    config = make_run(tmp_path)
    result = CliRunner().invoke(app, ["sample", "-c", str(config), "--runtime", "tensorrt"])
    assert result.exit_code == 2 and "tensorrt" in result.stderr and "onnxruntime" in result.stderr
