"""Write a Hugging Face model folder of the Llama family with random weights, built by transformers
itself, so that `minigpt import hf` can be tried (and tested, and benchmarked) without downloading a
model: config.json, model.safetensors (or shards), tokenizer.json and tokenizer_config.json.

    python scripts/random_hf_folder.py --shape smollm2-135m runs/smollm-random
    minigpt import hf runs/smollm-random --out runs/smollm

The shapes are those of real checkpoints (SmolLM2-135M, Qwen2.5-0.5B, Llama-3.2-1B), and `tiny` is
SmolLM2's in miniature (2 blocks of width 48, 6 query heads and 2 key/value heads, 320 ids: a folder
written and imported in seconds, as docs/guide/llama.md does); the weights are random, so what the
model says is noise, but every number minigpt computes from it is the number transformers computes.
The tokenizer is fitted to the shipped Tiny Shakespeare in the shape of the family's own
(shaped_tokenizer: SmolLM's byte-level BPE for tiny and SmolLM2, Qwen2's, Llama 3's), padded with
unreachable entries to the shape's vocabulary size. shaped_tokenizer is also what the tests build
every family's tokenizer with (Llama 2's and Mistral's SentencePiece-style ones too): one builder,
here, since minigpt itself only reads tokenizers. Needs the transformers extra (pip install -e
".[export]": transformers 5 or newer, and safetensors).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

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
        tokenizer="qwen2",
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
        tokenizer="llama3",
    ),
}

TOKENIZER_SHAPES = ("llama3", "qwen2", "smollm", "llama2", "mistral")
# Llama 3's and Qwen2's pre-tokenizer regexes: they differ in numbers (up to three digits, or one)
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    + r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")


def shaped_tokenizer(shape: str, lines: Iterable[str], vocab_size: int, bos: bool | None = None) -> tuple[str, dict]:
    """A tokenizer in the shape of a real family's, fitted to `lines`, and the tokenizer_config.json
    that comes with it: (tokenizer.json's text, the config). For folders built without downloading
    one (make_folder, the tests); what is fitted is small, the pipeline is the family's.

    - "llama3": byte-level BPE behind Llama 3's regex; <|begin_of_text|>, <|end_of_text|>, <|eot_id|>
      added after the merges; a template puts <|begin_of_text|> first (`bos`, default true).
    - "qwen2": NFC, Qwen2's regex (digits one by one), byte-level BPE; <|endoftext|>, <|im_start|>,
      <|im_end|> added after the merges; no BOS (`bos` default false); Qwen2Tokenizer's config.
    - "smollm": digits one by one, then GPT-2's byte-level pre-tokenizer; <|endoftext|>, <|im_start|>,
      <|im_end|> are ids 0, 1, 2; no BOS (default false); GPT2Tokenizer's config.
    - "llama2": SentencePiece-style BPE as Llama 2 and TinyLlama ship it: <unk>, <s>, </s>, then the
      256 byte tokens <0x00> .. <0xFF>, then the merges; a "▁" before the text and for every space (a
      normalizer), ByteFallback; <s> first (`bos`, default true) by the template and add_bos_token.
    - "mistral": as "llama2", with a Metaspace pre-tokenizer (prefix "▁" on the first word only).

    The tokenizer has exactly `vocab_size` ids, its special and byte tokens counted: where the
    fitting finds fewer merges, the rest are <filler_N> entries no text encodes to (as a real
    tokenizer's ids for text it was not fitted to)."""
    if shape not in TOKENIZER_SHAPES:
        raise ValueError(f"shape {shape!r} is not one of {', '.join(TOKENIZER_SHAPES)}")
    lines = list(lines)
    if shape in ("llama2", "mistral"):
        bos = True if bos is None else bos
        fit = Tokenizer(models.BPE())
        fit.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        fit.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never", split=True)  # no merge across words
        specials = ["<unk>", "<s>", "</s>"]
        trainer = trainers.BpeTrainer(vocab_size=max(vocab_size - 256 - len(specials), 1), show_progress=False)
        fit.train_from_iterator(lines, trainer)
        fitted = json.loads(fit.to_str())["model"]
        vocab = {s: i for i, s in enumerate(specials)}
        vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
        for piece in sorted(fitted["vocab"], key=fitted["vocab"].get):
            vocab.setdefault(piece, len(vocab))
        _fill(vocab, vocab_size)
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in fitted["merges"]]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
        if shape == "mistral":
            tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
        else:
            tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
        if bos:
            tok.post_processor = processors.TemplateProcessing(
                single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
            )
        config = {
            "add_bos_token": bos,
            "add_eos_token": False,
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "pad_token": None,
            "legacy": False,
            "clean_up_tokenization_spaces": False,
            "tokenizer_class": "LlamaTokenizer",
            "model_max_length": 2048,
        }
        return tok.to_str(), config

    specials = {
        "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
        "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "smollm": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    }[shape]
    bos = (shape == "llama3") if bos is None else bos
    tok = Tokenizer(models.BPE())
    if shape == "qwen2":
        tok.normalizer = normalizers.NFC()
    if shape == "smollm":
        steps = [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    else:
        regex = LLAMA3_REGEX if shape == "llama3" else QWEN2_REGEX
        steps = [
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    first = specials if shape == "smollm" else []  # SmolLM's are ids 0, 1, 2; the others' follow the merges
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - (0 if first else len(specials)),
        special_tokens=first,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    spec = json.loads(tok.to_str())
    _fill(spec["model"]["vocab"], vocab_size - (0 if first else len(specials)))
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    begin = specials[0]
    template = [processors.ByteLevel(trim_offsets=False)]
    if bos:
        template.append(
            processors.TemplateProcessing(
                single=f"{begin} $A", pair=f"{begin} $A {begin} $B", special_tokens=[(begin, tok.token_to_id(begin))]
            )
        )
    tok.post_processor = processors.Sequence(template)
    config = {
        "llama3": {
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|end_of_text|>",
            "clean_up_tokenization_spaces": True,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": 131072,
        },
        "qwen2": {
            "bos_token": None,
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "add_prefix_space": False,
            "errors": "replace",
            "split_special_tokens": False,
            "clean_up_tokenization_spaces": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "model_max_length": 32768,
        },
        "smollm": {
            "bos_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>",
            "unk_token": "<|endoftext|>",
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "tokenizer_class": "GPT2Tokenizer",
            "model_max_length": 8192,
        },
    }[shape]
    if bos:
        config["bos_token"] = begin
    return tok.to_str(), config


def _fill(vocab: dict[str, int], size: int) -> None:
    """`vocab` made `size` entries long with <filler_N> entries, which no merge reaches."""
    if len(vocab) > size:
        raise ValueError(f"{size} ids are fewer than the shape's own {len(vocab)} (its special and byte tokens)")
    n = 0
    while len(vocab) < size:
        vocab.setdefault(f"<filler_{n}>", len(vocab))
        n += 1


def folder_tokenizer(shape: str, vocab: int, bos: bool | None = None) -> tuple[str, dict]:
    """shaped_tokenizer fitted to the shipped Tiny Shakespeare: what make_folder writes."""
    return shaped_tokenizer(shape, CORPUS.read_text(encoding="utf-8").splitlines(keepends=True), vocab, bos)


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
    partial_rotary_factor: float | None = None,
    config_shape: str = "v5",
    sliding_window: int | None = None,
    eps: float = 1e-6,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    shards: int = 1,
    std: float | None = None,
    tokenizer: str = "smollm",
    bos: bool | None = None,
) -> Path:
    """A `family` (llama, mistral, qwen2, phi3) folder at `path` with random weights: N(0, std) for
    every matrix (std: transformers' 0.02 unless given; tests pass a larger one so that the model's
    outputs are far from uniform), gains 1 + N(0, std), biases N(0, std). `rope_scaling`: a dict as
    transformers' rope_parameters takes it (rope_type, factor, ...). `partial_rotary_factor`: the
    share of each head rope turns, in rope_parameters (None: left out; only Phi-3 reads it).
    `sliding_window`: Mistral's and Phi-3's. `config_shape`: "v5" writes transformers 5's
    rope_parameters, "legacy" the older rope_theta + rope_scaling pair (and partial_rotary_factor
    beside them, as Phi-3 and Phi-4-mini ship it). `shards`:
    the weights split into that many files with an index. `tokenizer`: the family whose tokenizer's
    shape folder_tokenizer gives it (smollm, llama3, qwen2, llama2, mistral), `bos` whether it puts a
    BOS first (None: as that family does); config.json's token ids are that tokenizer's."""
    import transformers

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    rope = {"rope_type": "default", "rope_theta": rope_theta, **(rope_scaling or {})}
    if partial_rotary_factor is not None:
        rope["partial_rotary_factor"] = partial_rotary_factor
    tokenizer_json, tokenizer_config = folder_tokenizer(tokenizer, vocab, bos)
    special = {token["content"]: token["id"] for token in json.loads(tokenizer_json)["added_tokens"]}
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
        bos_token_id=special.get(tokenizer_config["bos_token"]),
        eos_token_id=special[tokenizer_config["eos_token"]],
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
    elif family == "phi3":  # pad_token_id: Phi3Config's default 32000 lies past a small vocabulary
        config = transformers.Phi3Config(**common, sliding_window=sliding_window, pad_token_id=None)
        model_class = transformers.Phi3ForCausalLM
    else:
        raise SystemExit(f"family {family!r}: choose llama, mistral, qwen2 or phi3")
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
        if "partial_rotary_factor" in parameters:
            written["partial_rotary_factor"] = parameters.pop("partial_rotary_factor")
        kind = parameters.pop("rope_type", "default")
        written["rope_scaling"] = None if kind == "default" else {"type": kind, **parameters}
        (path / "config.json").write_text(json.dumps(written, indent=2))
    (path / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    tokenizer_config = {**tokenizer_config, "model_max_length": max_pos}
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
