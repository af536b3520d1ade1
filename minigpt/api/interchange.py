"""Weights in and out: a run exported to another format, and models from elsewhere (a GPT-2 folder,
with a PEFT adapter or not; a nanoGPT checkpoint) imported as run folders."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import MinigptError
from ..interchange import convert, llama, nanogpt, peft
from ..interchange import export as exporting
from ..io import no_progress
from ..runs.folder import check_out
from ..training.progress import task
from .run import load


def check_export(format: str, out: str | Path) -> None:
    """What `export` checks before the model is read (a large one takes a while): a known format,
    and a new or empty folder `out`; refused otherwise."""
    exporting.check_export(format, Path(out))


def export(
    run: str | Path | None = None,
    *,
    format: str,
    out: str | Path,
    checkpoint: str = "last",
    config: str | Path | None = None,
    set: Mapping[str, Any] | Sequence[str] = (),
    trust_exercise: bool = False,
) -> list[Path]:
    """`load(run, ...)` then `Run.export(format, out)`, with the format and the folder checked
    before the model is read (a large one takes a while)."""
    exporting.check_export(format, Path(out))
    opened = load(run, checkpoint=checkpoint, config=config, set=set, trust_exercise=trust_exercise)
    return opened.export(format, out)


# ---------------------------------------------------------------- models from elsewhere


def import_hf(
    folder: str | Path,
    out: str | Path,
    *,
    context: int | None = None,
    force: bool = False,
    progress: bool = True,
    adapter: str | Path | None = None,
) -> convert.Imported:
    """A Hugging Face folder of GPT-2 or of the Llama family (LlamaForCausalLM, MistralForCausalLM,
    Qwen2ForCausalLM, or Phi3ForCausalLM, whose partial_rotary_factor becomes [model] rope_fraction:
    config.json, model.safetensors, sharded or not, or pytorch_model.bin, and its tokenizer) as the
    run folder `out`, which every reading method and `train(init_from=out)` then use like any other.
    `context` keeps the position table's first rows; `force` replaces the run `out` holds, and
    nothing else: a folder holding other files, or `folder` itself, is refused
    (checked before anything is read); `progress` shows a bar while a large file is read.
    `adapter`: a PEFT LoRA adapter folder for a GPT-2 folder, merged into the weights (W + scale B A). Returns
    what was imported (its [model] section, tokenizer and origin)."""

    def read(bar) -> convert.Imported:
        if adapter is not None and llama.folder_model_type(Path(folder)) != llama.GPT2:
            raise MinigptError(
                "{adapter} merges a PEFT adapter into a GPT-2 folder, and {folder} holds a {literal} model; merge "
                "the adapter with PEFT (merge_and_unload), save the merged model and import that folder",
                folder=folder,
                literal=llama.folder_model_type(Path(folder)),
            )
        imported = llama.read_hf_folder(Path(folder), context=context, progress=bar)
        if adapter is not None:
            for name, delta in peft.read_adapter(Path(adapter), imported.model.n_layer).items():
                weight = imported.state[name]
                imported.state[name] = (weight.double() + delta).to(weight.dtype)
            imported.origin["adapter"] = str(Path(adapter).resolve())
        return imported

    sources = [("the model folder", Path(folder))] + ([("the adapter", Path(adapter))] if adapter is not None else [])
    return _imported(out, force, read, progress, sources)


def import_nanogpt(
    path: str | Path,
    out: str | Path,
    *,
    meta: str | Path | None = None,
    tokenizer: str | Path | None = None,
    context: int | None = None,
    force: bool = False,
    progress: bool = True,
) -> convert.Imported:
    """A nanoGPT checkpoint (its ckpt.pt, or the out folder holding it) as the run folder `out`:
    with `meta` its char-level dataset's meta.pkl, with `tokenizer` a GPT-2 tokenizer folder for its
    BPE checkpoints. The rest as `import_hf`."""

    def read(bar) -> convert.Imported:
        return nanogpt.read_nanogpt(
            Path(path),
            meta=None if meta is None else Path(meta),
            tokenizer_dir=None if tokenizer is None else Path(tokenizer),
            context=context,
            progress=bar,
        )

    sources = [("the nanoGPT checkpoint", Path(path))]
    sources += [(what, Path(given)) for what, given in (("the meta.pkl", meta), ("the tokenizer", tokenizer)) if given]
    return _imported(out, force, read, progress, sources)


def _imported(
    out: str | Path, force: bool, read: Callable, progress: bool, sources: list[tuple[str, Path]]
) -> convert.Imported:
    # Before reading anything (a large checkpoint takes a while): `force` replaces a run, never what
    # is read, nor a folder holding anything else.
    check_out(Path(out), force, sources)
    imported = read(task if progress else no_progress)
    convert.write_run(imported, Path(out), force=force)
    return imported
