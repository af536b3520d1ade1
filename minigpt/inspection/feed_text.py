"""The text view of a part fed one row (trace --feed): each step with its value, then which steps
the model's own module recorded and which the formula worked from its parameters.
"""

from __future__ import annotations

from ..model.stages import FFN, HIDDEN
from .feed import FORMULA, Fed
from .text_format import WIDTH, magnitude, number, pack, row_lines

KINDS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm", "none": "no norm"}


def render_feed(fed: Fed, digits: int = 4, width: int = WIDTH) -> str:
    """A part fed one row: each step as `name = formula  value`, then who computed what."""
    block, _, name = fed.part.rpartition(".")
    where = f"block {block.split('.')[-1]}'s {name}" if block else name
    if fed.kind == "ffn":  # its widths: C -> F -> C
        kind = " -> ".join(str(len(step.value)) for step in fed.steps if step.name in ("x", HIDDEN, FFN))
    else:
        kind = KINDS.get(fed.kind, fed.kind) + ("" if fed.eps is None else f", eps {fed.eps:g}")
    given = "[" + ", ".join(f"{v:g}" for v in fed.given) + "]"
    out = pack([f"{where} ({kind}), the model's own module,", f"on x = {given}"], width, " ")
    labels = [
        step.name if step.name in ("x", "gamma", "beta") else f"{step.name} = {step.formula}" for step in fed.steps
    ]
    label_w = max(len(label) for label in labels)
    room = width - 2 - label_w - 2
    for label, step in zip(labels, fed.steps):
        lines = [number(step.value, digits)] if isinstance(step.value, float) else row_lines(step.value, digits, room)
        out.append(f"  {label:<{label_w}}  {lines[0]}")
        out.extend(f"  {'':<{label_w}}  {line}" for line in lines[1:])
    worked = [step.name for step in fed.steps if step.computed_by == FORMULA]
    if not worked:
        recorded = ", ".join(step.name for step in fed.steps[1:])
        return "\n".join(
            out + pack(f"{recorded}: recorded inside the model's {name} module as it ran".split(" "), width, " ")
        )
    said = (
        f"{', '.join(worked)}: chapter 17.3's formula, worked from the module's parameters; {name}: the module's output"
    )
    if fed.agrees:
        said += ", which the formula gives too"
    else:
        said += f"; the formula's result differs from it by {magnitude(fed.difference, digits)}"
    return "\n".join(out + pack(said.split(" "), width, " "))
