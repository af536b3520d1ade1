"""`[train] tensorboard = true`: the metrics log's values as TensorBoard event files in the run
folder, read back here with TensorBoard's own reader; refused in one line where the extra is not
installed, before anything is written."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import need

from minigpt.training.events import Listener, StepDone


@pytest.fixture(autouse=True, scope="module")
def tensorboard_extra():
    need("tensorboard")


def event_scalars(run) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_every_logged_step_and_evaluation_is_in_tensorboard(cli, tiny_config, tmp_path):
    run = tmp_path / "run"
    result = cli("train", "-c", tiny_config, "--out", run, "--quiet", "--set", "train.tensorboard=true")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = [(r["step"], r["loss"]) for r in records if "loss" in r and not r.get("eval")]
    evals = [(r["step"], r["val_loss"]) for r in records if r.get("eval")]
    scalars = event_scalars(run)
    assert [step for step, _ in scalars["train/loss"]] == [step for step, _ in logged] == [5, 10, 15, 20]
    assert all(value == pytest.approx(loss, rel=1e-6) for (_, value), (_, loss) in zip(scalars["train/loss"], logged))
    assert [(s, pytest.approx(v, rel=1e-6)) for s, v in scalars["val/loss"]] == evals
    assert {"train/lr", "train/tokens_per_s", "val/bits_per_byte"} <= set(scalars)
    # each block's gradient norm (the tiny config has one block), as metrics.jsonl logs it
    norms = [(r["step"], r["block_grad_norms"][0]) for r in records if "loss" in r and not r.get("eval")]
    assert [(s, pytest.approx(v, rel=1e-6)) for s, v in scalars["grad_norm/block_0"]] == norms
    assert not any(tag.startswith("grad_norm/block_1") for tag in scalars)


class CrashAt(Listener):
    """Kills training where it stands, as a power cut would (no checkpoint at that step)."""

    def __init__(self, step: int):
        self.step = step

    def on_step(self, event: StepDone) -> None:
        if event.step == self.step:
            raise KeyboardInterrupt


def test_a_run_resumed_after_a_crash_logs_each_step_once(cli, tiny_config, tmp_path):
    import minigpt

    run = tmp_path / "run"
    settings = {"train.tensorboard": True, "train.checkpoint_interval": 10}
    with pytest.raises(KeyboardInterrupt):  # after the step-10 checkpoint, with steps 11..15 logged
        minigpt.train(out=run, config=tiny_config, set=settings, progress=False, listeners=[CrashAt(15)])
    assert [step for step, _ in event_scalars(run)["train/loss"]] == [5, 10, 15]
    resumed = cli(
        "train",
        "-c",
        tiny_config,
        "--out",
        run,
        "--quiet",
        "--resume",
        "--set",
        "train.tensorboard=true",
        "--set",
        "train.checkpoint_interval=10",
    )
    assert resumed.exit_code == 0, resumed.output
    # The crashed run's step 15 is purged: each step once, as the resumed run logged it.
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in records if "loss" in r and not r.get("eval")]
    assert event_scalars(run)["train/loss"] == logged and [s for s, _ in logged] == [5, 10, 15, 20]


def test_without_the_package_it_is_refused_in_one_line_and_nothing_is_written(cli, tiny_config, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` now fails
    run = tmp_path / "run"
    result = cli("train", "-c", tiny_config, "--out", run, "--set", "train.tensorboard=true")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "minigpt: error: [train] tensorboard = true needs the tensorboard package, which is not installed; "
        'pip install "minigpt[tensorboard]"  (or: pip install tensorboard)'
    )
    assert not run.exists()
