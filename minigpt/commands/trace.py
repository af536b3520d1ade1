"""`minigpt trace`: load a run, follow one position through every block, print tables or JSON."""

from __future__ import annotations

from pathlib import Path

import typer

from ..device import pick_device, use_threads
from ..errors import MinigptError
from ..interventions import AblateHead, Intervention, ReplaceResidual, Scale, SetInput
from ..run import load_model, reading_config
from ..trace import compare, prompt_ids, trace_position
from ..trace_text import check_display_options, render_comparison, render_text
from .common import user_errors


def main(
    config: Path | None,
    run: Path | None,
    prompt: str | None,
    ids: str | None,
    position: int | None,
    block: int | None,
    digits: int,
    top: int,
    as_json: bool,
    overrides: list[str],
    scale: list[str] = (),
    replace_residual: list[str] = (),
    ablate_head: list[str] = (),
    set_input: str | None = None,
    at_position: bool = False,
    compare_passes: bool = False,
    checkpoint: str = "last",
    png: Path | None = None,
) -> None:
    with user_errors():
        if (prompt is None) == (ids is None):
            raise MinigptError("give the tokens to trace with exactly one of -p/--prompt TEXT or --ids 3,1,4")
        check_display_options(digits, top)
        token_ids = parse_ids(ids) if ids is not None else None
        interventions = parse_interventions(scale, replace_residual, ablate_head, set_input)
        if compare_passes and not interventions:
            raise MinigptError(
                "--compare needs at least one intervention (--scale, --replace-residual, "
                "--ablate-head or --set-input) to compare with"
            )
        cfg, run_dir = reading_config(config, run, overrides)
        use_threads(cfg.train.threads or 1)  # one forward pass of one prompt: tiny matmuls
        model, tokenizer = load_model(cfg, run_dir, pick_device(cfg.train.device), checkpoint)
        if token_ids is None:
            token_ids = prompt_ids(tokenizer, prompt)
        if compare_passes:
            compared = compare(
                model,
                tokenizer,
                token_ids,
                interventions,
                position=position,
                block=block,
                top=top,
                only_at_position=at_position,
            )
            typer.echo(compared.to_json() if as_json else render_comparison(compared, digits=digits))
            return
        result = trace_position(
            model,
            tokenizer,
            token_ids,
            position=position,
            block=block,
            top=top,
            interventions=interventions,
            only_at_position=at_position,
        )
        if png is not None:
            from ..plot import attention_figure, save_png

            save_png(attention_figure(result), png)
        typer.echo(result.to_json() if as_json else render_text(result, digits=digits))


def parse_ids(text: str) -> list[int]:
    """`3,1,4` -> [3, 1, 4]; anything but comma-separated integers is refused."""
    if not text.strip():
        raise MinigptError("--ids is empty; trace needs at least one token id, e.g. --ids 3,1,4")
    ids = []
    for part in text.split(","):
        try:
            ids.append(int(part.strip()))
        except ValueError:
            raise MinigptError(
                f"--ids {text!r}: {part.strip()!r} is not an integer; give comma-separated token ids, e.g. --ids 3,1,4"
            ) from None
    return ids


def parse_interventions(
    scale: list[str], replace_residual: list[str], ablate_head: list[str], set_input: str | None
) -> list[Intervention]:
    """The intervention flags as typed values: `--scale B.attention=K`, `--replace-residual B`,
    `--ablate-head B.H`, `--set-input "2,2,2,2"` (B: a block index or `all`). Whether they fit the
    model (blocks, heads, width) is checked when the model is known."""
    out: list[Intervention] = []
    for text in scale:
        target, sep, factor = text.partition("=")
        where, dot, stage = target.partition(".")
        if not sep or not dot:
            raise MinigptError(
                f"--scale {text!r}: expected BLOCK.STAGE=FACTOR, e.g. --scale 0.attention=0 or --scale all.ffn=0.5"
            )
        out.append(Scale(_block_index(where, f"--scale {text}"), stage.strip(), _number(factor, f"--scale {text}")))
    for text in replace_residual:
        out.append(ReplaceResidual(_block_index(text, f"--replace-residual {text}")))
    for text in ablate_head:
        where, dot, head = text.partition(".")
        if not dot:
            raise MinigptError(f"--ablate-head {text!r}: expected BLOCK.HEAD, e.g. --ablate-head 0.1")
        out.append(
            AblateHead(_block_index(where, f"--ablate-head {text}"), _integer(head, f"--ablate-head {text}", "head"))
        )
    if set_input is not None:
        out.append(SetInput(tuple(_number(v, "--set-input") for v in set_input.split(","))))
    return out


def _block_index(text: str, where: str) -> int | None:
    text = text.strip()
    return None if text == "all" else _integer(text, where, "block")


def _integer(text: str, where: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise MinigptError(
            f"{where}: {what} {text.strip()!r} is not an integer"
            + ("; give a block index or 'all'" if what == "block" else "")
        ) from None


def _number(text: str, where: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise MinigptError(f"{where}: {text.strip()!r} is not a number") from None
