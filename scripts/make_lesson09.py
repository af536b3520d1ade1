"""Write data/lesson09/: the Transformer-block lesson's teaching model as a run folder.

    python scripts/make_lesson09.py [--config configs/lesson09.toml] [--out DIR]

One pre-norm block of width 4 (RMSNorm with unit gains, two attention heads, a SwiGLU MLP with
three hidden units, no biases, float64, the head tied to the token table), with fixed weights
written out below: small multiples of 1/4, so every number the trace shows can be followed by
hand. Nothing is trained. The tokenizer is a char tokenizer of four tokens, a = 0 .. d = 3.

Deterministic: running it again writes byte-identical files. The run folder's config.toml is
portable (`out = "."`, no `data`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
DEFAULT_CONFIG = REPO / "configs" / "lesson09.toml"

if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

from minigpt.config import load_config  # noqa: E402
from minigpt.errors import MinigptError  # noqa: E402
from minigpt.model.gpt import MiniGPT  # noqa: E402
from minigpt.runs.folder import write_model_run  # noqa: E402
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer  # noqa: E402

ALPHABET = "abcd"

# Row vectors, as in the lesson: x @ W. Rows of E and P are tokens and positions.
E = [
    [1.0, -0.5, 2.0, 0.5],  # a
    [0.5, 1.0, -1.0, 1.5],  # b
    [-1.0, 0.5, 0.5, -2.0],  # c
    [0.0, -1.5, 1.0, 1.0],
]  # d
P = [[0.0, 0.0, 0.0, 0.0], [0.25, 0.0, -0.25, 0.0], [0.0, 0.25, 0.0, -0.25], [-0.25, 0.25, 0.25, -0.25]]


def pattern(rows: int, cols: int, a: int, b: int, modulus: int) -> list[list[float]]:
    """A fixed matrix of quarters, ((a i + b j) mod m - m // 2) / 4: varied signs, nothing random."""
    return [[((a * i + b * j) % modulus - modulus // 2) / 4 for j in range(cols)] for i in range(rows)]


W_QKV = pattern(4, 12, 5, 3, 7)  # [W_Q | W_K | W_V], 4 -> 4 each
W_O = pattern(4, 4, 3, 2, 5)
W_GATE_VALUE = pattern(4, 6, 7, 2, 9)  # [W_gate | W_value], 4 -> 3 each
W_DOWN = pattern(3, 4, 2, 3, 5)


def build(config: Path) -> tuple:
    cfg = load_config(config)
    m = cfg.model
    wanted = dict(
        n_layer=1,
        n_embd=4,
        ffn_hidden=3,
        norm="rmsnorm",
        activation="swiglu",
        bias=False,
        tie_embeddings=True,
        dtype="float64",
    )
    wrong = {k: getattr(m, k) for k, v in wanted.items() if getattr(m, k) != v}
    if wrong or m.context != len(P):
        raise MinigptError(
            f"{config}: [model] must describe the lesson's block ({wanted}, context {len(P)}); "
            f"it differs in {wrong or {'context': m.context}}"
        )
    torch.manual_seed(0)  # every parameter is overwritten below; the seed only makes that obvious
    model = MiniGPT(m, vocab_size=len(E)).eval()
    block = model.blocks[0]

    def t(rows) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.float64)

    with torch.no_grad():
        model.token_table.weight.copy_(t(E))  # also the head (tied)
        model.position_table.weight.copy_(t(P))
        block.attention.qkv.weight.copy_(t(W_QKV).T)  # a Linear stores [out, in]
        block.attention.out.weight.copy_(t(W_O).T)
        block.ffn.W1.weight.copy_(t(W_GATE_VALUE).T)
        block.ffn.W2.weight.copy_(t(W_DOWN).T)
        for norm in (block.norm1, block.norm2, model.final_norm):
            norm.weight.fill_(1.0)
    tokenizer = TextTokenizer(train_tokenizer("char", 0, ALPHABET))
    if tokenizer.encode(ALPHABET) != list(range(len(ALPHABET))):
        raise MinigptError(f"char tokenizer gives {tokenizer.encode(ALPHABET)} for {ALPHABET!r}, not 0..3")
    return cfg, model, tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="(default: configs/lesson09.toml)")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default: the config's, data/lesson09)")
    args = parser.parse_args(argv)
    try:
        cfg, model, tokenizer = build(args.config)
    except MinigptError as exc:
        print(f"make_lesson09: error: {exc}", file=sys.stderr)
        return 2
    run_dir = args.out if args.out is not None else cfg.run_dir
    portable = dataclasses.replace(
        cfg,
        train=dataclasses.replace(cfg.train, out=".", data=""),
        source="configs/lesson09.toml via scripts/make_lesson09.py; teaching weights",
    )
    write_model_run(run_dir, portable, model, tokenizer)
    print(f"wrote {run_dir} (config.toml, tokenizer.json, checkpoint.pt)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
