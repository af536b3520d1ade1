"""The shapes the benchmarks compare at: issue 9's comparison shape (minigpt's [model] and [train]
changes) and the larger one of nanoGPT's shakespeare-char README, in both tools' spellings."""

from __future__ import annotations

# The comparison shape of issue 9 (nanoGPT's README in shared/anchors/nanogpt uses the same).
SHAPE = [
    "model.n_layer=4",
    "model.n_head=4",
    "model.n_embd=128",
    "model.context=32",
    "model.ffn_hidden=512",
    "model.bias=true",
    "model.dropout=0.0",
    "model.tie_embeddings=false",
    'model.norm="layernorm"',
    'model.activation="relu"',
    'tokenizer.kind="bpe"',
    "tokenizer.vocab_size=1024",
    "train.batch_size=64",
    "train.grad_accum=1",
]


# nanoGPT's shakespeare-char shape on a CPU (its README's), at our BPE-1024 vocabulary
LARGE_SHAPE = [
    "model.n_layer=6",
    "model.n_head=6",
    "model.n_embd=384",
    "model.ffn_hidden=1536",
    "model.context=256",
    "model.dropout=0.2",
    "train.batch_size=16",
]
NANO_LARGE_SHAPE = ["--n_layer=6", "--n_head=6", "--n_embd=384", "--block_size=256", "--batch_size=16", "--dropout=0.2"]
