"""Experiment 1 of docs/guide/remove-it-and-watch.md, as a learner runs it: `minigpt trace --ids` with
the tokens before a position permuted. Without a position table block 0's every row there is the
same whatever their order (attention mixes a set); with the table it is not. Block 1 is another
matter: the causal mask lets it tell orders apart even without positions (each earlier row saw a
different prefix), and the test says so too."""

from __future__ import annotations

import json

import pytest
import torch

from minigpt.config import load_config
from minigpt.model.gpt import MiniGPT
from minigpt.runs.folder import write_model_run
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

ORDERS = ("1,2,3,4,7", "4,3,2,1,7", "2,4,1,3,7", "3,1,4,2,7")


def float64_run(folder, positions: str):
    config = folder / "order.toml"
    config.write_text(
        f'[model]\ncontext = 8\nn_layer = 2\nn_head = 2\nn_embd = 16\nffn_hidden = 32\ndtype = "float64"\n'
        f'positions = "{positions}"\n[tokenizer]\nkind = "char"\n[train]\nout = "run"\ndevice = "cpu"\n',
        encoding="utf-8",
    )
    cfg = load_config(config)
    tokenizer = TextTokenizer(train_tokenizer("char", 0, "abcdefgh"))
    torch.manual_seed(0)
    model = MiniGPT(cfg.model, tokenizer.vocab_size)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.normal_(0.0, 0.5)
    write_model_run(cfg.run_dir, cfg, model, tokenizer)
    return cfg.run_dir


def traced_blocks(cli, run, ids: str) -> list[dict[str, list[float]]]:
    result = cli("trace", "--run", run, "--ids", ids, "--json")
    assert result.exit_code == 0, result.output
    return [block["stages"] for block in json.loads(result.stdout)["blocks"]]


def largest_difference(a: dict[str, list[float]], b: dict[str, list[float]]) -> float:
    return max(abs(x - y) for stage in a for x, y in zip(a[stage], b[stage]))


@pytest.mark.parametrize("positions", ["none", "learned"])
def test_block_0_at_a_token_ignores_the_order_before_it_only_without_positions(cli, tmp_path, positions):
    run = float64_run(tmp_path, positions)
    traced = [traced_blocks(cli, run, ids) for ids in ORDERS]
    block0 = [largest_difference(traced[0][0], other[0]) for other in traced[1:]]
    if positions == "none":
        # The same rows, to float64's rounding of sums taken in another order.
        assert max(block0) < 1e-12, block0
    else:
        assert min(block0) > 1e-3, block0
    # Block 1 reads block 0's rows at the earlier positions, each of which saw another prefix: the
    # causal mask alone lets it tell the orders apart.
    block1 = [largest_difference(traced[0][1], other[1]) for other in traced[1:]]
    assert min(block1) > 1e-3, block1
