"""LoRA adapters as PEFT saves them for GPT2LMHeadModel: adapter_config.json and
adapter_model.safetensors, both directions; and, written only, for the Llama family's folders
(llama_export.py splits the stacked matrices' adapters into one per projection).

PEFT names an adapter of GPT-2's Conv1D `transformer.h.{i}.attn.c_attn` as
`base_model.model.transformer.h.{i}.attn.c_attn.lora_A.weight` ([r, in]) and `...lora_B.weight`
([out, r]): the same factors minigpt keeps (model/lora.py), whichever way the base matrix is
stored, so they are written and read as they are, under the names gpt2_layout.py gives each matrix.
The update is (lora_alpha / r) B A; with `use_rslora`, lora_alpha / sqrt(r).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from ..errors import MinigptError
from ..runs.layout import ORIGIN_FILE
from . import gpt2_layout as gpt2
from . import llama_export
from .export import _safetensors, hf_family, imported_from

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
# minigpt's lora_targets -> the GPT-2 module each names, by its suffix (c_proj is in both sublayers)
MODULES = {"qkv": "attn.c_attn", "out": "attn.c_proj", "W1": "mlp.c_fc", "W2": "mlp.c_proj"}
OURS = {"qkv": "attention.qkv", "out": "attention.out", "W1": "ffn.W1", "W2": "ffn.W2"}
# adapter_config.json keys minigpt reads, and what each must be for the update minigpt computes
UNSUPPORTED = {
    "use_dora": (False, None),
    "bias": ("none",),
    "modules_to_save": (None, []),
    "layers_to_transform": (None,),
    "layer_replication": (None,),
    "lora_bias": (False, None),
}


def _theirs(ours_weight: str) -> str:
    """GPT2LMHeadModel's name of a block matrix, from minigpt's (`blocks.0.attention.qkv.weight`)."""
    for parameter in gpt2.BLOCK:
        if parameter.ours.format(i=0).split(".", 2)[2] == ours_weight.split(".", 2)[2]:
            return parameter.at(int(ours_weight.split(".")[1])).theirs
    raise KeyError(ours_weight)


def export_adapter(model, adapters: dict[str, torch.Tensor], settings: dict[str, Any], out: Path) -> list[Path]:
    """A LoRA run's adapters (its checkpoint's tensors and settings; `model` the merged model) as
    PEFT's files, for the folder `--format hf` writes of its base (GPT-2's or a Llama family's: the
    same choice, export.hf_family), or the folder the base was imported from."""
    base = Path(settings["base"]["run"])
    imported = imported_from(base)
    family, refusal = hf_family(model, imported)
    if refusal:
        folder = "a GPT-2 folder" if family == gpt2.MODEL_TYPE else f"a {llama_export.NAMES[family]} folder"
        raise MinigptError("{format} peft adapts " + folder + ", which cannot express {refusal}", refusal=refusal)
    # PEFT loads an adapter onto base_model_name_or_path: the Hugging Face folder the base run was
    # imported from when it is such an import itself (not a fine-tune of one), else the base run
    own = _own_import(base)
    name = str(own["path"]) if own is not None and str(own.get("kind", "")).startswith("hf") else str(base)
    if family == gpt2.MODEL_TYPE:
        return write_adapter(adapters, settings, name, out)
    tensors = llama_export.adapter_tensors(adapters, model.cfg, family)
    targets = llama_export.target_modules(settings["targets"].split(","), family)
    return _write(tensors, settings, name, targets, False, out)


def _own_import(run_dir: Path) -> dict[str, Any] | None:
    """The origin of `run_dir` when it was itself imported (its origin.json names a source path and
    no run it was fine-tuned from); None otherwise."""
    try:
        origin = json.loads((Path(run_dir) / ORIGIN_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return origin if isinstance(origin, dict) and "run" not in origin and "path" in origin else None


def write_adapter(adapters: dict[str, torch.Tensor], settings: dict[str, Any], base: str, out: Path) -> list[Path]:
    """A LoRA checkpoint's adapters (model/lora.adapter_state's names) and settings as PEFT's files
    for GPT2LMHeadModel."""
    tensors = {}
    for name, tensor in adapters.items():
        matrix, factor = name.rsplit(".", 1)  # blocks.0.attention.qkv, lora_A
        theirs = _theirs(matrix + ".weight").removesuffix(".weight")
        tensors[f"{theirs}.{factor}.weight"] = tensor
    targets = [MODULES[name] for name in settings["targets"].split(",")]
    return _write(tensors, settings, base, targets, True, out)  # GPT-2's Conv1D stores [in, out]


def _write(
    tensors: dict[str, torch.Tensor], settings: dict[str, Any], base: str, targets: list[str], conv1d: bool, out: Path
) -> list[Path]:
    """adapter_model.safetensors (`tensors` under the base model's module names) and adapter_config.json."""
    save_file = _safetensors()
    out.mkdir(parents=True, exist_ok=True)
    # in the run's dtype: PEFT loads a float64 adapter onto a float64 model as it is
    stored = {PREFIX + name: t.detach().contiguous().clone() for name, t in tensors.items()}
    save_file(stored, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": settings["rank"],
        "lora_alpha": settings["alpha"],
        "lora_dropout": settings["dropout"],
        "target_modules": targets,
        "fan_in_fan_out": conv1d,
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
        "rank_pattern": {},
        "alpha_pattern": {},
    }
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return [out / WEIGHTS_FILE, out / CONFIG_FILE]


def read_adapter(folder: Path, n_layer: int) -> dict[str, torch.Tensor]:
    """The update (scale) B A of every matrix a PEFT LoRA adapter for GPT-2 changes, as [out, in]
    under minigpt's weight names; what minigpt does not compute is refused naming the key."""
    folder = Path(folder)
    if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise MinigptError(
            "{adapter} {folder} is not a PEFT adapter folder (it needs {CONFIG_FILE} and {WEIGHTS_FILE})",
            folder=folder,
            CONFIG_FILE=CONFIG_FILE,
            WEIGHTS_FILE=WEIGHTS_FILE,
        )
    config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    where = folder / CONFIG_FILE
    if config.get("peft_type") != "LORA":
        raise MinigptError(
            "{where}: peft_type = {given!r}; minigpt reads LoRA adapters only",
            where=where,
            given=config.get("peft_type"),
        )
    for key, allowed in UNSUPPORTED.items():
        if config.get(key, allowed[0]) not in allowed:
            raise MinigptError(
                "{where}: {key} = {given!r} is an adapter minigpt does not compute (it reads plain LoRA: {key} "
                "= {allowed!r}); merge it with PEFT (merge_and_unload) and import the merged folder instead",
                where=where,
                key=key,
                given=config[key],
                allowed=allowed[0],
            )
    from safetensors.torch import load_file

    raw = load_file(str(folder / WEIGHTS_FILE))
    by_theirs = {p.at(i).theirs.removesuffix(".weight"): p.at(i).ours for i in range(n_layer) for p in gpt2.BLOCK}
    deltas: dict[str, torch.Tensor] = {}
    for name in sorted(raw):
        if not name.endswith(".lora_A.weight"):
            continue
        module = name.removeprefix(PREFIX).removesuffix(".lora_A.weight")
        ours = by_theirs.get(module)
        if ours is None or not ours.endswith(".weight"):
            raise MinigptError(
                "{where}: an adapter on {module}, which is not one of GPT-2's block matrices minigpt adapts "
                "(attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj); target_modules must be among them",
                where=where,
                module=module,
            )
        A, B = raw[name].double(), raw[name.replace(".lora_A.", ".lora_B.")].double()
        rank = A.shape[0]
        pattern = next((v for k, v in config.get("rank_pattern", {}).items() if module.endswith(k)), None)
        alpha = next(
            (v for k, v in config.get("alpha_pattern", {}).items() if module.endswith(k)), config["lora_alpha"]
        )
        if pattern is not None and pattern != rank:
            raise MinigptError("{where}: rank_pattern says {pattern} for {module}, its tensors {rank}", where=where,
                               pattern=pattern, module=module, rank=rank)  # fmt: skip
        scale = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
        deltas[ours] = B @ A * scale  # [out, in], as nn.Linear stores the matrix
    if not deltas:
        raise MinigptError("{where}: its {WEIGHTS_FILE} holds no LoRA tensors", where=where, WEIGHTS_FILE=WEIGHTS_FILE)
    return deltas
