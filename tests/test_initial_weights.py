"""`train --steps 0`: a run folder of the initial weights, as `[model] init` drew them, for reading a
model before any update (the gradient at initialisation: `trace --grad`; Xiong et al.'s Theorem 1 in
docs/guide/depth.md)."""

from __future__ import annotations

import json

import pytest
import torch

import minigpt
from minigpt.model.gpt import MiniGPT
from tests.conftest import SHAKESPEARE, TINY_CONFIG


@pytest.mark.parametrize("init", ["gpt2", "xavier"])
def test_zero_steps_keep_the_weights_the_seed_and_init_draw(cli, tmp_path, init):
    (tmp_path / "tiny.txt").write_text(SHAKESPEARE.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    (tmp_path / "tiny.toml").write_text(TINY_CONFIG, encoding="utf-8")
    run = tmp_path / "run"
    result = cli("train", "-c", str(tmp_path / "tiny.toml"), "--out", str(run), "--steps", "0",
                 "--set", f'model.init="{init}"')  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "trained 0 steps" in result.output and "initial weights (step 0)" in result.output
    loaded = minigpt.load(run)
    # the same draws as a model built from the same seed, before any data is read
    torch.manual_seed(loaded.cfg.train.seed)
    fresh = MiniGPT(loaded.cfg.model, loaded.model.vocab_size)
    for (name, kept), (_, drawn) in zip(loaded.model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(kept, drawn), name
    # read before any update: the gradient at initialisation, through the trace
    traced = json.loads(cli("trace", "--run", str(run), "-p", "ROMEO:", "--grad", "--json").stdout)
    assert traced["gradient"]["input"]["norm"] > 0
    # nothing was trained, so there is no metrics log; the run cannot be lengthened by resuming
    assert not (run / "metrics.jsonl").exists()
