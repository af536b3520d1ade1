"""Write a Hugging Face model folder of the Llama family with random weights, built by transformers
itself, so that `minigpt import hf` can be tried (and tested, and benchmarked) without downloading a
model: config.json, model.safetensors (or shards), tokenizer.json and tokenizer_config.json.

    python scripts/random_hf_folder.py --shape smollm2-135m runs/smollm-random
    minigpt import hf runs/smollm-random --out runs/smollm

The shapes are those of real checkpoints (SmolLM2-135M, Qwen2.5-0.5B, Llama-3.2-1B), and `tiny` is
SmolLM2's in miniature (2 blocks of width 48, 6 query heads and 2 key/value heads, 320 ids: a folder
written and imported in seconds, as docs/guide/llama.md does); the weights are random, so what the
model says is noise, but every number minigpt computes from it is the number transformers computes.
The tokenizer is a byte-level BPE fitted to the shipped Tiny Shakespeare, padded with unreachable
entries to the shape's vocabulary size. Needs the transformers extra
(pip install -e ".[export]": transformers 5 or newer, and safetensors).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "data" / "tinyshakespeare.txt"

# The shapes of real checkpoints, from their config.json files.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(  # SmolLM2-135M's kind of model (Llama, grouped-query, tied, rope_theta 1e5), made small
        family="llama",
        n_layer=2,
        hidden=48,
        heads=6,
        kv_heads=2,
        intermediate=128,
        vocab=320,
        max_pos=256,
        tie=True,
        rope_theta=100000.0,
        eps=1e-5,
    ),
    "smollm2-135m": dict(
        family="llama",
        n_layer=30,
        hidden=576,
        heads=9,
        kv_heads=3,
        intermediate=1536,
        vocab=49152,
        max_pos=8192,
        tie=True,
        rope_theta=100000.0,
        eps=1e-5,
    ),
    "qwen2.5-0.5b": dict(
        family="qwen2",
        n_layer=24,
        hidden=896,
        heads=14,
        kv_heads=2,
        intermediate=4864,
        vocab=151936,
        max_pos=32768,
        tie=True,
        rope_theta=1000000.0,
        eps=1e-6,
    ),
    "llama-3.2-1b": dict(
        family="llama",
        n_layer=16,
        hidden=2048,
        heads=32,
        kv_heads=8,
        head_dim=64,
        intermediate=8192,
        vocab=128256,
        max_pos=131072,
        tie=True,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        eps=1e-5,
    ),
}

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS = "<|begin_of_text|>"


def tokenizer_json(vocab: int, bos: bool = False) -> str:
    """A byte-level BPE fitted to the shipped text with exactly `vocab` ids: the special tokens,
    the merges it finds, then unreachable filler entries (a real tokenizer's ids for other text).
    `bos`: a post-processor that starts every encoding with <|begin_of_text|>, as Llama 3's does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = SPECIALS + ([BOS] if bos else [])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(CORPUS)], trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
        )
    spec = json.loads(tok.to_str())
    table = spec["model"]["vocab"]
    if len(table) + sum(t["content"] not in table for t in spec["added_tokens"]) > vocab:
        raise SystemExit(f"a vocabulary of {vocab} ids is smaller than the tokenizer's own {len(table)}")
    filler = 0
    while len(table) < vocab:  # ids no merge reaches: the rows exist, as in a real model's table
        table[f"<filler_{filler}>"] = len(table)
        filler += 1
    return json.dumps(spec, ensure_ascii=False)


def make_folder(
    path: str | Path,
    family: str = "llama",
    *,
    n_layer: int = 2,
    hidden: int = 48,
    heads: int = 6,
    kv_heads: int = 2,
    head_dim: int | None = None,
    intermediate: int = 80,
    vocab: int = 300,
    max_pos: int = 64,
    tie: bool = False,
    attention_bias: bool = False,
    mlp_bias: bool = False,
    rope_theta: float = 10000.0,
    rope_scaling: dict[str, Any] | None = None,
    config_shape: str = "v5",
    sliding_window: int | None = None,
    eps: float = 1e-6,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    shards: int = 1,
    std: float | None = None,
    bos: bool = False,
) -> Path:
    """A `family` (llama, mistral, qwen2) folder at `path` with random weights: N(0, std) for every
    matrix (std: transformers' 0.02 unless given; tests pass a larger one so that the model's
    outputs are far from uniform), gains 1 + N(0, std), biases N(0, std). `rope_scaling`: a dict as
    transformers' rope_parameters takes it (rope_type, factor, ...). `config_shape`: "v5" writes
    transformers 5's rope_parameters, "legacy" the older rope_theta + rope_scaling pair. `shards`:
    the weights split into that many files with an index."""
    import transformers

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    rope = {"rope_type": "default", "rope_theta": rope_theta, **(rope_scaling or {})}
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=n_layer,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_pos,
        rms_norm_eps=eps,
        tie_word_embeddings=tie,
        rope_parameters=rope,
        bos_token_id=len(SPECIALS) if bos else 0,  # the ids tokenizer_json gives them
        eos_token_id=0,
    )
    if head_dim is not None:
        common["head_dim"] = head_dim
    if family == "llama":
        config = transformers.LlamaConfig(**common, attention_bias=attention_bias, mlp_bias=mlp_bias)
        model_class = transformers.LlamaForCausalLM
    elif family == "mistral":
        config = transformers.MistralConfig(**common, sliding_window=sliding_window)
        model_class = transformers.MistralForCausalLM
    elif family == "qwen2":
        config = transformers.Qwen2Config(**common, use_sliding_window=False)
        model_class = transformers.Qwen2ForCausalLM
    else:
        raise SystemExit(f"family {family!r}: choose llama, mistral or qwen2")
    torch.manual_seed(seed)
    model = model_class(config)
    if std is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                    p.copy_(1 + std * torch.randn_like(p))
                else:
                    p.normal_(0.0, std)
    model = model.to(dtype)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    shard = size // shards + 1 if shards > 1 else "1000GB"  # bytes per file
    model.save_pretrained(path, safe_serialization=True, max_shard_size=shard)
    del model
    if config_shape == "legacy":  # transformers 4's spelling: rope_theta beside rope_scaling
        written = json.loads((path / "config.json").read_text())
        parameters = written.pop("rope_parameters", None) or rope
        written["rope_theta"] = parameters.pop("rope_theta", rope_theta)
        kind = parameters.pop("rope_type", "default")
        written["rope_scaling"] = None if kind == "default" else {"type": kind, **parameters}
        (path / "config.json").write_text(json.dumps(written, indent=2))
    (path / "tokenizer.json").write_text(tokenizer_json(vocab, bos), encoding="utf-8")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_pos,
        "bos_token": BOS if bos else SPECIALS[0],
        "eos_token": SPECIALS[0],
        "add_bos_token": bos,
        "clean_up_tokenization_spaces": False,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m", help="a real checkpoint's shape")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the stored dtype")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import transformers

    transformers.utils.logging.disable_progress_bar()  # its bar for writing one file says nothing here
    shape = dict(SHAPES[args.shape])
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    make_folder(args.out, **shape, dtype=dtype, seed=args.seed)
    print(f"wrote {args.out}: a random-weight {args.shape}-shaped {shape['family']} folder ({args.dtype})")


if __name__ == "__main__":
    main()
