"""Export a run's weights to formats other tools load.

    safetensors   model.safetensors (minigpt's own parameter names) + config.json ([model], vocab)
    hf            a Hugging Face GPT-2 folder: GPT2LMHeadModel.from_pretrained and
                  PreTrainedTokenizerFast.from_pretrained load it

GPT-2 is this model's family: pre-norm blocks with LayerNorm, learned absolute positions, a final
LayerNorm, a vocabulary head. Its names and layouts (Conv1D's [in, out] weights, the tied head,
the config keys) are gpt2_layout.py's, the table the import reads too. What GPT-2 cannot express
(RMSNorm, post-norm, SwiGLU, Attention Residuals) is refused, naming the key. Without biases, GPT-2's are exported as
zeros, which computes the same.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..errors import MinigptError
from ..model.gpt import MiniGPT
from ..text.tokenizer import TextTokenizer
from . import gpt2_layout as gpt2

EXTRA = 'pip install "minigpt[export]"  (safetensors, transformers)'


def _safetensors():
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise MinigptError(
            "exporting needs the safetensors package, which is not installed; {EXTRA}", EXTRA=EXTRA
        ) from None
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
    if cfg.positions != "learned":
        return f"[model] positions = {cfg.positions!r}: GPT-2 adds a learned position table (wpe)"
    if cfg.residual == "attention":
        return (
            "[model] residual = 'attention': GPT-2's blocks add each sublayer to the residual stream, with no "
            "learned read over depth"
        )
    if not cfg.residual:
        return "[model] residual = false: GPT-2's blocks add each sublayer to the residual stream"
    if cfg.ffn_hidden == 0:
        return "[model] ffn_hidden = 0: every GPT-2 block has an MLP"
    if cfg.norm != "layernorm":
        return f"[model] norm = {cfg.norm!r}: GPT-2 has LayerNorm only"
    if cfg.norm_position != "pre":
        return f"[model] norm_position = {cfg.norm_position!r}: GPT-2 is pre-norm"
    if cfg.activation not in gpt2.EXPORTED_ACTIVATIONS:
        return f"[model] activation = {cfg.activation!r}: GPT-2's MLP has no gate"
    return None


def gpt2_state(model: MiniGPT) -> dict[str, torch.Tensor]:
    """minigpt's parameters under GPT-2's names and layouts (gpt2_layout.py)."""
    ours = model.state_dict()
    state = {}
    for parameter in gpt2.parameters(model.cfg.n_layer):
        if parameter.tied and model.cfg.tie_embeddings:
            continue
        if parameter.bias_of and parameter.ours not in ours:  # zeros compute what no bias does
            tensor = torch.zeros(ours[parameter.bias_of].shape[0])
        else:
            tensor = ours[parameter.ours].T if parameter.conv1d else ours[parameter.ours]
        state[parameter.theirs] = tensor.detach().float().contiguous().clone()
    return state


def gpt2_config(model: MiniGPT) -> dict[str, Any]:
    """The model's settings under GPT2Config's keys."""
    values = {**asdict(model.cfg), "vocab_size": model.vocab_size}
    values["activation"] = gpt2.EXPORTED_ACTIVATIONS[model.cfg.activation]
    return {setting.key: values[ours] for ours, setting in gpt2.SETTINGS.items()}


def export_hf(model: MiniGPT, tokenizer: TextTokenizer, out: Path) -> list[Path]:
    refusal = gpt2_refusal(model)
    if refusal:
        raise MinigptError(
            "{format} hf cannot express {refusal}; export with {format} safetensors instead", refusal=refusal
        )
    save_file = _safetensors()
    cfg = model.cfg
    out.mkdir(parents=True, exist_ok=True)
    save_file(gpt2_state(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(
        out / "config.json",
        {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": gpt2.MODEL_TYPE,
            **gpt2_config(model),
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
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


FORMATS = ("safetensors", "hf", "peft")


def check_export(format: str, out: Path) -> None:
    """A known format, and a new folder or an empty one: nothing of the user's is overwritten."""
    if format not in FORMATS:
        raise MinigptError("{format} {given!r} is not one of: {join}", given=format, join=", ".join(FORMATS))
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MinigptError("{out} {given} already exists and is not an empty folder; choose another {out}", given=out)


def export(model: MiniGPT, tokenizer: TextTokenizer, format: str, out: Path) -> list[Path]:
    """The model in `format` (one of FORMATS) in the folder `out`; the files written."""
    out = Path(out)
    check_export(format, out)
    try:
        return export_safetensors(model, out) if format == "safetensors" else export_hf(model, tokenizer, out)
    except OSError as exc:
        raise MinigptError(
            "{out} {given} cannot be written ({reason}); choose another {out}",
            given=out,
            reason=exc.strerror or exc,
        ) from None
