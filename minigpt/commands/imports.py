"""`minigpt import hf DIR --out RUN` and `minigpt import nanogpt PATH --out RUN`: a model from
elsewhere becomes a run folder (convert.py reads it), which every other command then reads as its
own: sample, trace, explore, eval, export, and train --init-from to fine-tune it."""

from __future__ import annotations

import typer

from .. import api
from .common import command_line, say, shown_path, user_errors
from .options_make import ImportHfOptions, ImportNanogptOptions


def main(o: ImportHfOptions | ImportNanogptOptions) -> None:
    with user_errors():
        if isinstance(o, ImportHfOptions):
            imported = api.import_hf(o.folder, o.out, context=o.context, force=o.force, adapter=o.adapter)
        else:
            imported = api.import_nanogpt(
                o.path, o.out, meta=o.meta, tokenizer=o.tokenizer, context=o.context, force=o.force
            )
    m, origin = imported.model, imported.origin
    padded = (
        f"; rows {imported.tokenizer_size:,}..{imported.vocab_size - 1:,} are padding, never sampled"
        if imported.padded
        else ""
    )
    cropped = f" (of its {origin['position_rows']:,})" if origin.get("position_rows", m.context) != m.context else ""
    kv = f" ({m.kv_heads} key/value heads)" if m.kv_heads != m.n_head else ""
    widened = f"; {origin['widened']}" if "widened" in origin else ""  # half-precision weights, read exactly
    say(
        f"imported {origin['kind']} {shown_path(origin['path'])}: {imported.parameters:,} parameters, "
        f"{m.n_layer} blocks, "
        f"{m.n_head} heads{kv}, width {m.n_embd}, {m.activation}, context {m.context}{cropped}, "
        f"{imported.tokenizer_size:,} token ids{padded}{widened}"
    )
    typer.echo(str(o.out))  # on stdout alone, for scripts
    say(f'trace it with: {command_line("minigpt", "trace", "--run", shown_path(o.out))} -p "Hello"')
