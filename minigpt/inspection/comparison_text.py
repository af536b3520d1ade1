"""The text view of a comparison (trace --compare, --compare-run, --compare-prompt): both passes
side by side, stage by stage at the traced position, then the next tokens before and after and the
KL divergence between them.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..model.stages import INPUT
from .comparison import Comparison
from .legend_text import stage_formulas
from .text_format import WIDTH, magnitude, number, pack, row_lines, show_token
from .trace_text import GRAD, depth_lines, gradient_lines


def _gradient_comparison(result: Comparison, label_w: int, num_w: int, digits: int, width: int) -> list[str]:
    """Each pass's gradient norms, stage by stage: both of the loss of one target."""
    before, after = result.before.as_dict()["gradient"], result.after.as_dict()["gradient"]
    out = [""] + gradient_lines(before, result.before.position, digits, width, after)
    for first, second in zip(before["blocks"], after["blocks"]):
        out.append(f"block {first['index']}: {GRAD} before and after")
        out.append(f"  {'stage':<{label_w}}  {'before':>{num_w}}  {'after':>{num_w}}")
        rows = {INPUT: (first["input"], second["input"])} if first["input"] or second["input"] else {}
        rows.update({name: (grad, second["stages"].get(name)) for name, grad in first["stages"].items()})
        rows.update({name: (None, grad) for name, grad in second["stages"].items() if name not in rows})
        out += [
            f"  {name:<{label_w}}  {_grad_norm(a, digits):>{num_w}}  {_grad_norm(b, digits):>{num_w}}"
            for name, (a, b) in rows.items()
        ]
    return out


def _maybe(value: float | None, digits: int) -> str:
    """A norm, or `-` where the stage is not computed on that side."""
    return "-" if value is None else number(value, digits)


def _prompts_compared(result: Comparison, width: int) -> list[str]:
    """Which prompt each pass is: the ids and their tokens."""
    out = []
    for label, trace, note in (("before:", result.before, " (the compared prompt)"), ("after: ", result.after, "")):
        ids = ",".join(str(i) for i in trace.ids)
        out += pack(
            [f"{label} ids {ids}:", *(show_token(t) for t in trace.tokens[:-1]), show_token(trace.tokens[-1]) + note],
            width,
            " ",
        )
    return out


def _grad_norm(gradient: dict[str, Any] | None, digits: int) -> str:
    return "-" if gradient is None else magnitude(gradient["norm"], digits)


def _runs_compared(result: Comparison, width: int) -> list[str]:
    """Which run each pass is, and the [model] keys the two runs differ in (each one of the same
    shape: what differs changes what is computed, which the rows below show)."""
    out = [f"before: run {result.compared_run} (the compared run)", f"after:  run {result.run}"]
    theirs, ours = result.before.model, result.after.model
    differing = [f"{key} {theirs[key]!r} -> {ours[key]!r};" for key in ours if theirs.get(key) != ours[key]]
    if differing:
        differing[-1] = differing[-1].rstrip(";")
        out += pack(["[model] differs, before -> after:", *differing], width, " ")
    return out


def render_comparison(result: Comparison, digits: int = 4, width: int = WIDTH) -> str:
    """Both passes side by side, stage by stage at the traced position: the rows (cut to fit),
    their norms and the norm of the change; then the top next tokens before and after, and the KL
    divergence between the two next-token distributions. Two runs compared: which run each pass
    is, first."""
    before, after = result.before, result.after
    p, tokens = before.position, before.tokens
    out = pack(
        [
            f"comparison at position {p}",
            f"(token {show_token(tokens[p])}, id {before.ids[p]})",
            f"in a prompt of {len(tokens)} token(s)",
        ],
        width,
        " ",
    )
    listed = [item + ";" for item in result.interventions[:-1]] + result.interventions[-1:]
    if result.compared_run is None and result.compared_ids is None:
        out += pack(["interventions:", *listed], width, " ")
    else:
        if result.compared_run is not None:
            out += _runs_compared(result, width)
        else:
            out += _prompts_compared(result, width)
        if listed:
            out += pack(["interventions, in both passes:", *listed], width, " ")
    label_w = max(len("stage"), *(len(name) for block in result.stages for name in block))
    num_w = max(len("|before|"), digits + 4)
    room = width - 4 - len("before  ")
    # Blocks that compute in different orders (pre-norm beside post-norm): each row says what it is.
    orders = before.model["norm_position"] != after.model["norm_position"]
    said = (stage_formulas(before.model), stage_formulas(after.model)) if orders else ({}, {})
    if orders:
        room -= 2 + max(len(f"= {f}") for formulas in said for f in formulas.values())
    for k, (entry, block) in enumerate(zip(before.blocks, result.stages)):
        out += [
            "",
            f"block {entry.index} of {before.model['n_layer']}: norms before and after, the change's norm, the rows",
        ]
        out.append(f"  {'stage':<{label_w}}  {'|before|':>{num_w}}  {'|after|':>{num_w}}  {'|change|':>{num_w}}")
        shown = {
            name: [None if row is None else row_lines(row, digits, room)[0] for row in (change.before, change.after)]
            for name, change in block.items()
        }
        row_w = max(len(row) for rows in shown.values() for row in rows if row is not None)
        for name, change in block.items():
            out.append(
                f"  {name:<{label_w}}  {_maybe(change.norm_before, digits):>{num_w}}"
                f"  {_maybe(change.norm_after, digits):>{num_w}}  {_maybe(change.change, digits):>{num_w}}"
            )
            for label, row, formulas, trace in zip(("before", "after "), shown[name], said, (before, after)):
                if row is None:  # a stage this side's block does not compute
                    out.append(f"    {label}  (none: a {trace.model['norm_position']}-norm block computes no {name})")
                    continue
                formula = f"  = {formulas[name]}" if name in formulas else ""
                out.append(f"    {label}  {row:<{row_w}}{formula}".rstrip())
        for which, trace in (("before", before), ("after", after)):  # Attention Residuals: each pass's reads
            out += depth_lines([asdict(read) for read in trace.blocks[k].depth], p, digits, width, which)
    for which, trace in (("before", before), ("after", after)):
        if trace.final_depth is not None:
            out += ["", f"after the last block ({which})"]
            out += depth_lines([asdict(trace.final_depth)], p, digits, width, which)
    if before.gradient is not None:
        out += _gradient_comparison(result, label_w, num_w, digits, width)
    out += ["", f"next token after position {p}, before and after:"]
    tok_w = max([5] + [len(show_token(c.token)) for c in before.next_tokens + after.next_tokens])
    prob_w = max(len("probability"), digits + 2)
    out.append(
        f"  {'rank':>4}  {'token':<{tok_w}}  {'probability':>{prob_w}}    {'token':<{tok_w}}  {'probability':>{prob_w}}"
    )
    for rank, (a, b) in enumerate(zip(before.next_tokens, after.next_tokens), 1):
        out.append(
            f"  {rank:>4}  {show_token(a.token):<{tok_w}}  {number(a.probability, digits):>{prob_w}}"
            f"    {show_token(b.token):<{tok_w}}  {number(b.probability, digits):>{prob_w}}"
        )
    out.append(f"KL(before || after) = {number(result.kl_divergence, digits)} nats")
    return "\n".join(out)
