"""The text views of why a model predicts a token, fitting an 80-column terminal: an attribution's
parts as signed bars, largest first, and a patching sweep's effects as grids of blocks by positions
(or heads) with the tokens as column heads. They lay out the data of the `--json` objects; the only
arithmetic is the sum of the parts left out of the bars.
"""

from __future__ import annotations

import math

from ..model.stages import FINAL_READ
from .attribution import Attribution, Part
from .patching import Patching, swept_stages
from .text_format import WIDTH, number, pack, show_token

SHOWN_PARTS = 24  # the largest parts get a bar each; the rest are summed on one line


def _versus(token: str, versus: str | None) -> str:
    return f"{show_token(token)}" + (f" minus {show_token(versus)}" if versus is not None else "")


def render_attribution(result: Attribution, digits: int = 4, width: int = WIDTH, shown: int = SHOWN_PARTS) -> list[str]:
    """The logit (difference) at the traced position, then its parts by size with a bar each: `+`
    bars for what pushes towards the token, `-` bars for what pushes away. With Attention Residuals
    each part's source weight in the final read is shown beside it (`xW`: already in the value)."""
    what = "logit of " + _versus(result.token, result.versus)
    weighted = any(part.weight is not None for part in result.parts)
    said = (
        [
            "what each part wrote, times the weight of its source in final_read",
            "(xW: this pass's depth weights), through final_norm (its scale",
        ]
        if weighted
        else ["what each part wrote into the residual stream, through final_norm (its scale"]
    )
    out = pack(
        [
            f"attribution: {what} at position {result.position} = {number(result.total, digits)},",
            f"the sum of {len(result.parts)} parts:",
            *said,
            f"{number(result.scale, digits)} from this pass) and the head",
        ],
        width,
        " ",
    )
    ranked = sorted(result.parts, key=lambda part: -abs(part.value))
    top, rest = ranked[:shown], ranked[shown:]
    weights = {id(part): "" if part.weight is None else f"x{part.weight:.{min(digits, 3)}f}" for part in top}
    weight_w = max(len(text) for text in weights.values())
    name_w = max(len(part.name) for part in top)
    num_w = max(len(number(part.value, digits)) for part in top)
    room = max(4, width - 2 - name_w - 2 - num_w - 2 - (weight_w + 2 if weight_w else 0))
    largest = max(abs(part.value) for part in top) or 1.0
    for part in top:
        bar = ("+" if part.value >= 0 else "-") * round(room * abs(part.value) / largest)
        weight = f"  {weights[id(part)]:>{weight_w}}" if weight_w else ""
        out.append(f"  {part.name:<{name_w}}  {number(part.value, digits):>{num_w}}{weight}  {bar}".rstrip())
    if rest:
        out.append(f"  ... {len(rest)} smaller parts sum to {number(math.fsum(p.value for p in rest), digits)}")
    out.append(
        f"sum of the parts {number(math.fsum(p.value for p in result.parts), digits)}; the forward pass's "
        f"value differs by {result.error:.1e}"
    )
    return out


def render_attribution_pair(before: Attribution, after: Attribution, digits: int = 4, width: int = WIDTH) -> list[str]:
    """An attribution without and with interventions: each part's value in both, largest change first."""
    out = pack(
        [
            f"attribution: logit of {_versus(before.token, before.versus)} at position {before.position},",
            f"before {number(before.total, digits)} and after {number(after.total, digits)} the interventions,",
            "by part (largest change first):",
        ],
        width,
        " ",
    )
    pairs = (
        list(zip(before.parts, after.parts))
        if [p.name for p in before.parts] == [p.name for p in after.parts]
        else _aligned(before, after)
    )
    pairs.sort(key=lambda pair: -abs(pair[1].value - pair[0].value))
    name_w = max(len("part"), *(len(a.name) for a, _ in pairs))
    num_w = max(len("before"), digits + 4)
    out.append(f"  {'part':<{name_w}}  {'before':>{num_w}}  {'after':>{num_w}}  {'change':>{num_w}}")
    for a, b in pairs[:SHOWN_PARTS]:
        out.append(
            f"  {a.name:<{name_w}}  {number(a.value, digits):>{num_w}}  {number(b.value, digits):>{num_w}}"
            f"  {number(b.value - a.value, digits):>{num_w}}"
        )
    if len(pairs) > SHOWN_PARTS:
        out.append(f"  ... {len(pairs) - SHOWN_PARTS} parts that change less")
    return out


def _aligned(before: Attribution, after: Attribution) -> list:
    """Parts by name in both (a replaced input row is one `input` part after, token + position before)."""
    first, second = {p.name: p for p in before.parts}, {p.name: p for p in after.parts}
    names = list(dict.fromkeys([*first, *second]))
    return [(first.get(n, Part(n, 0.0)), second.get(n, Part(n, 0.0))) for n in names]


def render_patching(result: Patching, digits: int = 2, width: int = WIDTH) -> str:
    """The sweep as grids: for each stage (or the heads), blocks down and positions across."""
    clean, corrupt = result.clean, result.corrupt
    out = pack(
        [
            f"activation patching: {show_token(result.answer)} minus {show_token(result.versus)} at the last position",
            f"clean {number(clean.logit_difference, 4)}, corrupt {number(corrupt.logit_difference, 4)};",
            "each cell: how much of the clean difference one patch restores",
            "(0: the corrupt run's, 1: the clean run's)",
        ],
        width,
        " ",
    )
    out += pack(["clean:  "] + [show_token(t) for t in clean.tokens], width, " ")
    out += pack(["corrupt:"] + [show_token(t) for t in corrupt.tokens], width, " ")
    n_layer = 1 + max(e.block for e in result.effects)
    columns = [f"{p}:{show_token(t, 6)}" for p, t in enumerate(clean.tokens)]
    if result.by == "stage":
        for stage, blocks in swept_stages(result.effects).items():
            cells = {(e.block, e.position): e.effect for e in result.effects if e.stage == stage}
            if stage == FINAL_READ:  # after the last block: one row, the final norm's read
                out += ["", f"{stage} patched (the final norm's read), by position (columns)"]
                labels = ["final"]
            else:
                out += ["", f"{stage} patched, by block (rows) and position (columns)"]
                labels = [f"block {i}" for i in blocks]
            out += _grid(labels, columns, lambda r, c, cells=cells, blocks=blocks: cells[(blocks[r], c)], digits, width)
        return "\n".join(out)
    n_head = 1 + max(e.head for e in result.effects)
    every = {(e.block, e.head): e.effect for e in result.effects if e.position is None}
    out += ["", "each head's output patched at every position, by block (rows) and head (columns)"]
    out += _grid(
        [f"block {i}" for i in range(n_layer)],
        [f"head {h}" for h in range(n_head)],
        lambda r, c: every[(r, c)],
        digits,
        width,
    )
    best = {}
    for e in result.effects:
        if e.position is not None and abs(e.effect) > abs(best.get((e.block, e.position), 0.0)):
            best[(e.block, e.position)] = e.effect
    heads_at = {(e.block, e.position, e.head): e.effect for e in result.effects if e.position is not None}
    out += ["", "each head at one position: the largest effect of any head, by block and position"]
    out += _grid([f"block {i}" for i in range(n_layer)], columns, lambda r, c: best.get((r, c), 0.0), digits, width)
    ranked = sorted((item for item in heads_at.items() if item[1] != 0.0), key=lambda item: -abs(item[1]))[:10]
    out += [
        "",
        "the largest single-position head patches (the others restore nothing):"
        if len(ranked) < 10
        else "the largest single-position head patches:",
    ]
    out += [
        f"  block {b} head {h} at position {p} ({show_token(clean.tokens[p])}): {number(v, digits)}"
        for (b, p, h), v in ranked
    ]
    return "\n".join(out)


def _grid(rows: list[str], columns: list[str], value, digits: int, width: int) -> list[str]:
    """Rows by columns of numbers, the columns wrapped into as many bands as 80 columns need."""
    label_w = max(len(r) for r in rows)
    cell_w = max(digits + 3, *(len(c) for c in columns))
    per_band = max(1, (width - 2 - label_w) // (cell_w + 2))
    out: list[str] = []
    for first in range(0, len(columns), per_band):
        band = range(first, min(len(columns), first + per_band))
        if first:
            out.append("")
        out.append("  " + " " * label_w + "".join(f"  {columns[c]:>{cell_w}}" for c in band))
        for r, label in enumerate(rows):
            out.append(f"  {label:<{label_w}}" + "".join(f"  {number(value(r, c), digits):>{cell_w}}" for c in band))
    return out
