"""Export a run's weights to formats other tools load.

    safetensors   model.safetensors (minigpt's own parameter names) + config.json ([model], vocab)
    hf            a Hugging Face folder transformers loads (the model class and
                  PreTrainedTokenizerFast.from_pretrained): GPT-2's, or the Llama family's
                  (llama_export.py) for a model with its block

Which folder `hf` writes is chosen in one place, `hf_family`: a model with lesson 09's block (rope
positions, RMSNorm, SwiGLU) is a Llama-family folder (LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM, or Phi3ForCausalLM for rope on a share of each head), any other is chapter 17's
GPT-2: pre-norm blocks with LayerNorm, learned absolute positions, a final LayerNorm, a vocabulary
head. GPT-2's names and layouts (Conv1D's [in, out]
weights, the tied head, the config keys) are gpt2_layout.py's, the table the import reads too. What
the chosen family cannot express (for GPT-2: RMSNorm, post-norm, SwiGLU, grouped-query heads,
Attention Residuals) is refused, naming the key and, where the other family holds it, saying so.
Without biases, GPT-2's are exported as zeros, which computes the same. Every format keeps the
run's dtype: a float64 run is written as float64, and config.json says so (dtype_keys).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..config import Residual
from ..errors import MinigptError
from ..model.gpt import MiniGPT
from ..runs.layout import ORIGIN_FILE
from ..text.tokenizer import TextTokenizer
from . import gpt2_layout as gpt2
from . import llama_export

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


def llama_holds(what: str = "it") -> str:
    """What a GPT-2 refusal adds where the Llama family's folder holds the setting (`what`)."""
    block = [part for part in ("rope positions", "RMSNorm", "SwiGLU") if part != what]
    return f"; a Llama-family folder holds {what}, with {', '.join(block[:-1])} and {block[-1]}"


def gpt2_refusal(model: MiniGPT) -> str | None:
    cfg = model.cfg
    if cfg.positions != "learned":
        pointer = llama_holds("rope positions") if cfg.positions == "rope" else ""
        return f"[model] positions = {cfg.positions!r}: GPT-2 adds a learned position table (wpe){pointer}"
    if cfg.residual_kind is Residual.ATTENTION:
        return (
            "[model] residual = 'attention': GPT-2's blocks add each sublayer to the residual stream, with no "
            "learned read over depth"
        )
    if cfg.residual_kind is Residual.NONE:
        return "[model] residual = false: GPT-2's blocks add each sublayer to the residual stream"
    if cfg.ffn_hidden == 0:
        return "[model] ffn_hidden = 0: every GPT-2 block has an MLP"
    if cfg.norm != "layernorm":
        pointer = llama_holds("RMSNorm") if cfg.norm == "rmsnorm" else ""
        return f"[model] norm = {cfg.norm!r}: GPT-2 has LayerNorm only{pointer}"
    if cfg.norm_position != "pre":
        return f"[model] norm_position = {cfg.norm_position!r}: GPT-2 is pre-norm"
    if cfg.activation not in gpt2.EXPORTED_ACTIVATIONS:
        pointer = llama_holds("SwiGLU") if cfg.activation == "swiglu" else ""
        return f"[model] activation = {cfg.activation!r}: GPT-2's MLP has no gate{pointer}"
    if cfg.kv_heads != cfg.n_head:
        return f"[model] n_kv_head = {cfg.n_kv_head}: GPT-2 has a key and value head per query head{llama_holds()}"
    if cfg.resolved_head_width * cfg.n_head != cfg.n_embd:
        return (
            f"[model] head_width = {cfg.head_width}: GPT-2's {cfg.n_head} heads split n_embd = {cfg.n_embd} "
            f"evenly{llama_holds()}"
        )
    if 0 < cfg.sliding_window < cfg.context:
        return f"[model] sliding_window = {cfg.sliding_window}: GPT-2 attends to every earlier position"
    return None


def hf_family(model: MiniGPT, imported: dict[str, Any] | None = None) -> tuple[str, str | None]:
    """The one place `--format hf` (and `--format peft`, for the folder of its base) chooses what it
    writes: the model_type of a Llama-family folder for a model with that block (the family of the
    folder it was imported from, `imported` being the import's origin), GPT-2's otherwise; and what
    that family cannot express (None: nothing)."""
    if llama_export.is_family_block(model.cfg):
        family = llama_export.family(model.cfg, imported_type(imported))
        return family, llama_export.refusal(model.cfg, family)
    return gpt2.MODEL_TYPE, gpt2_refusal(model)


def transformers_float32(model: MiniGPT, format: str) -> str | None:
    """What transformers computes in float32 of a float64 run exported as `format`, as the export's
    note says it (the weights are written in float64 as they are); None: nothing. transformers'
    LlamaRMSNorm (and Qwen2's, Mistral's and Phi-3's) casts its input to float32 whatever the weights' dtype,
    and it computes rope's angles in float32, which a minigpt-trained float64 run computes in float64
    ([model] rope_angles = "dtype"; an imported run's "float32" already matches). GPT-2 computes in
    the weights' dtype throughout."""
    cfg = model.cfg
    if format not in ("hf", "peft") or cfg.dtype != "float64" or not llama_export.is_family_block(cfg):
        return None
    angles = " and rope's angles (this run computes them in float64)" if cfg.rope_angles == "dtype" else ""
    return (
        f"transformers computes RMSNorm{angles} in float32 in a Llama-family model even with float64 weights: "
        "its logits will agree with this run's within float32 rounding, not float64's (the weights are written "
        "in float64, as they are)"
    )


def imported_type(origin: dict[str, Any] | None) -> str | None:
    """The model_type of the Hugging Face folder an import's origin names (its kind is "hf-" + it)."""
    kind = str((origin or {}).get("kind", ""))
    return kind.removeprefix("hf-") if kind.startswith("hf-") else None


def imported_from(run_dir: Path) -> dict[str, Any] | None:
    """The origin of the import a run descends from (its own origin.json's, or that of the run it was
    fine-tuned from, and so on back), or None: trained here, or the chain is gone."""
    folder, seen = Path(run_dir), set()
    while folder.resolve() not in seen:
        seen.add(folder.resolve())
        try:
            origin = json.loads((folder / ORIGIN_FILE).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return None
        if not isinstance(origin, dict):
            return None
        if "run" not in origin:  # an import's: a model from elsewhere
            return origin
        if not isinstance(origin["run"], str):
            return None
        folder = Path(origin["run"])
    return None


def gpt2_state(model: MiniGPT) -> dict[str, torch.Tensor]:
    """minigpt's parameters under GPT-2's names and layouts (gpt2_layout.py)."""
    ours = model.state_dict()
    state = {}
    for parameter in gpt2.parameters(model.cfg.n_layer):
        if parameter.tied and model.cfg.tie_embeddings:
            continue
        if parameter.bias_of and parameter.ours not in ours:  # zeros compute what no bias does
            weight = ours[parameter.bias_of]
            tensor = torch.zeros(weight.shape[0], dtype=weight.dtype)
        else:
            tensor = ours[parameter.ours].T if parameter.conv1d else ours[parameter.ours]
        state[parameter.theirs] = tensor.detach().contiguous().clone()
    return state


def gpt2_config(model: MiniGPT) -> dict[str, Any]:
    """The model's settings under GPT2Config's keys."""
    values = {**asdict(model.cfg), "vocab_size": model.vocab_size}
    values["activation"] = gpt2.EXPORTED_ACTIVATIONS[model.cfg.activation]
    return {setting.key: values[ours] for ours, setting in gpt2.SETTINGS.items()}


def export_hf(
    model: MiniGPT, tokenizer: TextTokenizer, out: Path, imported: dict[str, Any] | None = None
) -> list[Path]:
    """The folder transformers loads: GPT-2's or a Llama family's (hf_family); `imported`: the origin
    of the import the run descends from (imported_from), whose family a Llama-family model keeps."""
    family, refusal = hf_family(model, imported)
    if refusal:
        raise MinigptError(
            "{format} hf cannot express {refusal}; export with {format} safetensors instead", refusal=refusal
        )
    save_file = _safetensors()
    out.mkdir(parents=True, exist_ok=True)
    if family == gpt2.MODEL_TYPE:
        tensors, config = gpt2_state(model), gpt2_folder_config(model)
    else:
        tensors = llama_export.state(model, family)
        config = llama_export.config_json(model.cfg, model.vocab_size, family)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "config.json", {**config, **dtype_keys(model.cfg.dtype)})
    (out / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": model.cfg.context,
            "clean_up_tokenization_spaces": False,
        },
    )
    return [out / name for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json")]


def gpt2_folder_config(model: MiniGPT) -> dict[str, Any]:
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": gpt2.MODEL_TYPE,
        **gpt2_config(model),
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "bos_token_id": None,
        "eos_token_id": None,
    }


def dtype_keys(dtype: str) -> dict[str, str]:
    """The weights' dtype (the run's: nothing is narrowed) under both names config.json has had:
    transformers 5 and 4.56 on read `dtype`, earlier releases and other tools `torch_dtype`.
    from_pretrained loads the weights in it when asked for dtype="auto" (5.x's default; 4.x loads
    float32 unless asked)."""
    return {"dtype": dtype, "torch_dtype": dtype}


FORMATS = ("safetensors", "hf", "peft")


def check_export(format: str, out: Path) -> None:
    """A known format, and a new folder or an empty one: nothing of the user's is overwritten."""
    if format not in FORMATS:
        raise MinigptError("{format} {given!r} is not one of: {join}", given=format, join=", ".join(FORMATS))
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MinigptError("{out} {given} already exists and is not an empty folder; choose another {out}", given=out)


def export(
    model: MiniGPT, tokenizer: TextTokenizer, format: str, out: Path, imported: dict[str, Any] | None = None
) -> list[Path]:
    """The model in `format` (one of FORMATS but peft) in the folder `out`; the files written.
    `imported`: the origin of the import the run descends from (imported_from), for `hf`."""
    out = Path(out)
    check_export(format, out)
    try:
        if format == "safetensors":
            return export_safetensors(model, out)
        return export_hf(model, tokenizer, out, imported)
    except OSError as exc:
        raise MinigptError(
            "{out} {given} cannot be written ({reason}); choose another {out}",
            given=out,
            reason=exc.strerror or exc,
        ) from None
