"""Export a run's weights to formats other tools load.

    safetensors   model.safetensors (minigpt's own parameter names) + config.json ([model], vocab)
    hf            a Hugging Face GPT-2 folder: GPT2LMHeadModel.from_pretrained and
                  PreTrainedTokenizerFast.from_pretrained load it

GPT-2 is this model's family: pre-norm blocks with LayerNorm, learned absolute positions, a final
LayerNorm, a vocabulary head. Its Conv1D layers store weights as [in, out], the transpose of a
Linear; its c_attn is W_Q, W_K and W_V side by side, as minigpt's qkv. What GPT-2 cannot express
(RMSNorm, post-norm, SwiGLU) is refused, naming the key. Without biases, GPT-2's are exported as
zeros, which computes the same.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from ..errors import MinigptError, option
from ..model.gpt import MiniGPT
from ..text.tokenizer import TextTokenizer

EXTRA = 'pip install "minigpt[export]"  (safetensors, transformers)'
# transformers' names: "gelu" is the exact (erf) GELU, "gelu_new" GPT-2's tanh approximation.
GPT2_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new"}


def _safetensors():
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise MinigptError(f"exporting needs the safetensors package, which is not installed; {EXTRA}") from None
    return save_file


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def export_safetensors(model: MiniGPT, out: Path) -> list[Path]:
    save_file = _safetensors()
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().contiguous().clone() for name, t in model.state_dict().items()}
    if model.cfg.tie_embeddings:
        del tensors["head.weight"]  # the token table, stored once (config.json says it is tied)
    save_file(tensors, str(out / "model.safetensors"))
    _write_json(out / "config.json", {"format": "minigpt", "model": asdict(model.cfg), "vocab_size": model.vocab_size})
    return [out / "model.safetensors", out / "config.json"]


def gpt2_refusal(model: MiniGPT) -> str | None:
    cfg = model.cfg
    if cfg.norm != "layernorm":
        return f"[model] norm = {cfg.norm!r}: GPT-2 has LayerNorm only"
    if cfg.norm_position != "pre":
        return f"[model] norm_position = {cfg.norm_position!r}: GPT-2 is pre-norm"
    if cfg.activation not in GPT2_ACTIVATIONS:
        return f"[model] activation = {cfg.activation!r}: GPT-2's MLP has no gate"
    return None


def gpt2_state(model: MiniGPT) -> dict[str, torch.Tensor]:
    """minigpt's parameters under GPT-2's names and layouts."""

    def t(x: torch.Tensor) -> torch.Tensor:
        return x.detach().float().contiguous().clone()

    def bias(linear) -> torch.Tensor:
        return t(linear.bias) if linear.bias is not None else torch.zeros(linear.out_features)

    def norm_bias(norm) -> torch.Tensor:
        return t(norm.bias) if norm.bias is not None else torch.zeros_like(t(norm.weight))

    state = {
        "transformer.wte.weight": t(model.token_table.weight),
        "transformer.wpe.weight": t(model.position_table.weight),
        "transformer.ln_f.weight": t(model.final_norm.weight),
        "transformer.ln_f.bias": norm_bias(model.final_norm),
    }
    for i, block in enumerate(model.blocks):
        p = f"transformer.h.{i}."
        state.update(
            {
                p + "ln_1.weight": t(block.norm1.weight),
                p + "ln_1.bias": norm_bias(block.norm1),
                p + "attn.c_attn.weight": t(block.attention.qkv.weight.T),
                p + "attn.c_attn.bias": bias(block.attention.qkv),
                p + "attn.c_proj.weight": t(block.attention.out.weight.T),
                p + "attn.c_proj.bias": bias(block.attention.out),
                p + "ln_2.weight": t(block.norm2.weight),
                p + "ln_2.bias": norm_bias(block.norm2),
                p + "mlp.c_fc.weight": t(block.ffn.W1.weight.T),
                p + "mlp.c_fc.bias": bias(block.ffn.W1),
                p + "mlp.c_proj.weight": t(block.ffn.W2.weight.T),
                p + "mlp.c_proj.bias": bias(block.ffn.W2),
            }
        )
    if not model.cfg.tie_embeddings:
        state["lm_head.weight"] = t(model.head.weight)
    return state


def export_hf(model: MiniGPT, tokenizer: TextTokenizer, out: Path) -> list[Path]:
    refusal = gpt2_refusal(model)
    if refusal:
        raise MinigptError(
            f"{option('format')} hf cannot express {refusal}; export with {option('format')} safetensors instead"
        )
    save_file = _safetensors()
    cfg = model.cfg
    out.mkdir(parents=True, exist_ok=True)
    save_file(gpt2_state(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(
        out / "config.json",
        {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": model.vocab_size,
            "n_positions": cfg.context,
            "n_embd": cfg.n_embd,
            "n_layer": cfg.n_layer,
            "n_head": cfg.n_head,
            "n_inner": cfg.ffn_hidden,
            "activation_function": GPT2_ACTIVATIONS[cfg.activation],
            "layer_norm_epsilon": cfg.norm_eps,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "tie_word_embeddings": cfg.tie_embeddings,
            "bos_token_id": None,
            "eos_token_id": None,
            "torch_dtype": "float32",
        },
    )
    (out / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": cfg.context,
            "clean_up_tokenization_spaces": False,
        },
    )
    return [out / name for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json")]


FORMATS = ("safetensors", "hf")


def check_export(format: str, out: Path) -> None:
    """A known format, and a new folder or an empty one: nothing of the user's is overwritten."""
    if format not in FORMATS:
        raise MinigptError(f"{option('format')} {format!r} is not one of: {', '.join(FORMATS)}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MinigptError(
            f"{option('out')} {out} already exists and is not an empty folder; choose another {option('out')}"
        )


def export(model: MiniGPT, tokenizer: TextTokenizer, format: str, out: Path) -> list[Path]:
    """The model in `format` (one of FORMATS) in the folder `out`; the files written."""
    out = Path(out)
    check_export(format, out)
    try:
        return export_safetensors(model, out) if format == "safetensors" else export_hf(model, tokenizer, out)
    except OSError as exc:
        raise MinigptError(
            f"{option('out')} {out} cannot be written ({exc.strerror or exc}); choose another {option('out')}"
        ) from None
