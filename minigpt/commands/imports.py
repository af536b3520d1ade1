"""`minigpt import hf DIR --out RUN` and `minigpt import nanogpt PATH --out RUN`: a model from
elsewhere becomes a run folder (convert.py reads it), which every other command then reads as its
own: sample, trace, explore, eval, export, and train --init-from to fine-tune it."""

from __future__ import annotations

import typer

from ..interchange.convert import read_hf_gpt2, read_nanogpt, write_run
from ..memory import parameter_count
from ..runs.folder import check_new_run
from ..training.progress import task
from .common import command_line, say, shown_path, user_errors
from .options import ImportHfOptions, ImportNanogptOptions


def main(o: ImportHfOptions | ImportNanogptOptions) -> None:
    with user_errors():
        check_new_run(o.out, o.force)  # before reading anything: a large checkpoint takes a while
        if isinstance(o, ImportHfOptions):
            imported = read_hf_gpt2(o.folder, context=o.context, progress=task)
        else:
            imported = read_nanogpt(o.path, meta=o.meta, tokenizer_dir=o.tokenizer, context=o.context, progress=task)
        write_run(imported, o.out, force=o.force)
    m, origin = imported.model, imported.origin
    padded = (
        f"; rows {imported.tokenizer_size:,}..{imported.vocab_size - 1:,} are padding, never sampled"
        if imported.padded
        else ""
    )
    cropped = f" (of its {origin['position_rows']:,})" if origin.get("position_rows", m.context) != m.context else ""
    parameters = parameter_count(m, imported.vocab_size)
    say(
        f"imported {origin['kind']} {origin['path']}: {parameters:,} parameters, {m.n_layer} blocks, "
        f"{m.n_head} heads, width {m.n_embd}, {m.activation}, context {m.context}{cropped}, "
        f"{imported.tokenizer_size:,} token ids{padded}"
    )
    typer.echo(str(o.out))  # on stdout alone, for scripts
    say(f'trace it with: {command_line("minigpt", "trace", "--run", shown_path(o.out))} -p "Hello"')
