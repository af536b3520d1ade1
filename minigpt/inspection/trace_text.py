"""The text view of a trace: tables that fit an 80-column terminal, with the numbers at a chosen
number of decimals. It lays out exactly the data of `Trace.to_json()`; the only arithmetic here is
the mean, standard deviation (biased) and norm printed for rows too wide to show in full. With a
gradient (`grad`), each row's `|grad|` column is the norm the gradient computed (gradients.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from ..errors import MinigptError
from ..model.positions import alibi_slopes
from ..model.stages import (
    ATTENTION,
    FFN,
    FINAL_NORM,
    FINAL_READ,
    HIDDEN,
    INPUT,
    NORM1,
    NORM2,
    OUTPUT,
    READ1,
    READ2,
    RESIDUAL1,
    RESIDUAL2,
    block_stages,
)
from .feed import FORMULA, Fed
from .gradients import GIVEN, PREDICTION, PROMPT
from .trace import Comparison, Trace

WIDTH = 80
MAX_DIGITS = 15
TOKEN_SHOWN = 16  # a token's escaped text is cut to this many characters in tables


def check_digits(digits: int) -> None:
    if not 0 <= digits <= MAX_DIGITS:
        raise MinigptError(
            "{digits} {given} is out of range; show 0..{MAX_DIGITS} decimals",
            given=digits,
            MAX_DIGITS=MAX_DIGITS,
        )


def number(value: float, digits: int) -> str:
    """Fixed decimals; a value that rounds to zero prints without a minus sign."""
    text = f"{value:.{digits}f}"
    if text.startswith("-") and float(text) == 0.0:
        text = text[1:]
    return text


def magnitude(value: float, digits: int) -> str:
    """A norm that may span many orders (a gradient's): fixed decimals from 0.001 to 10,000, else
    in scientific notation, so a vanishing gradient does not print as zero."""
    if value == 0 or 1e-3 <= abs(value) < 1e4:
        return number(value, digits)
    return f"{value:.{max(1, digits - 1)}e}"


def show_token(text: str, limit: int = TOKEN_SHOWN) -> str:
    """Escaped like a Python string (a newline shows as \\n), cut to `limit` characters."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def row_lines(row: list[float], digits: int, room: int) -> list[str]:
    """The row in full if it fits `room` characters; else its first coordinates, an ellipsis, and a
    second line with its mean, standard deviation (biased) and norm."""
    parts = [number(v, digits) for v in row]
    full = "[" + ", ".join(parts) + "]"
    if len(full) <= room:
        return [full]
    shown = len(parts) - 1
    while shown > 1 and len("[" + ", ".join(parts[:shown]) + ", ...]") > room:
        shown -= 1
    n = len(row)
    mean = math.fsum(row) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in row) / n)
    norm = math.sqrt(math.fsum(v * v for v in row))
    stats = [f"mean {number(mean, digits)}", f"std {number(std, digits)}", f"norm {number(norm, digits)}"]
    return ["[" + ", ".join(parts[:shown]) + ", ...]"] + _pack(stats, room, "  ")


def _pack(items: list[str], room: int, sep: str) -> list[str]:
    """Greedy lines of `items` joined by `sep`, each at most `room` characters where possible."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(sep) + len(item) <= room:
            lines[-1] += sep + item
        else:
            lines.append(item)
    return lines


def _shape(shape: list[int]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


GRAD = "|grad|"


def _table(
    rows: list[tuple[str, list[float], list[int]]],
    digits: int,
    width: int,
    heading: tuple[str, str, str] | None = None,
    grads: list[float | None] | None = None,
) -> list[str]:
    """`  label  row  shape` lines, and with `grads` (one norm or None per row) a `|grad|` column;
    a wide row continues under its own column."""
    label_w = max(len(label) for label, _, _ in rows + ([heading] if heading else []))
    shape_w = max([len(_shape(shape)) for _, _, shape in rows] + ([len(heading[2])] if heading and grads else []))
    shown = [] if grads is None else ["" if g is None else magnitude(g, digits) for g in grads]
    grad_w = max([len(GRAD)] + [len(g) for g in shown]) if grads is not None else 0
    room = width - 2 - label_w - 2 - 2 - shape_w - (2 + grad_w if grads is not None else 0)
    cells = [(label, row_lines(row, digits, room), _shape(shape)) for label, row, shape in rows]
    row_w = max(len(line) for _, lines, _ in cells for line in lines)
    if heading:
        row_w = max(row_w, len(heading[1]))

    def joined(label: str, row: str, shape: str, grad: str | None) -> str:
        end = shape if grad is None else f"{shape:<{shape_w}}  {grad:>{grad_w}}"
        return f"  {label:<{label_w}}  {row:<{row_w}}  {end}".rstrip()

    out = []
    if heading:
        out.append(joined(*heading, None if grads is None else GRAD))
    for k, (label, lines, shape) in enumerate(cells):
        out.append(joined(label, lines[0], shape, None if grads is None else shown[k]))
        out.extend(f"  {'':<{label_w}}  {line}" for line in lines[1:])
    return out


TARGET_FROM = {
    PROMPT: "the prompt's next token",
    GIVEN: "the token asked for",
    PREDICTION: "the model's top prediction (the prompt has no next token here)",
}


def _gradient_lines(
    gradient: dict[str, Any], p: int, digits: int, width: int, after: dict[str, Any] | None = None
) -> list[str]:
    """What the `|grad|` column is the norm of: the loss, its target and where that came from (with
    `after`, the modified pass's gradient of the same loss, a comparison's)."""
    target = show_token(gradient["target"])
    loss = f"{number(gradient['loss'], digits)} nats"
    if after is not None:
        loss += f" before, {number(after['loss'], digits)} after"
    return _pack(
        [
            f"{GRAD}: the norm of d loss / d row, through {'each' if after else 'this same'} pass, for",
            f"loss = -log p({target}) = {loss} at position {p};",
            f"{target} (id {gradient['target_id']}) is {TARGET_FROM[gradient['target_from']]}",
        ],
        width,
        " ",
    )


def _bottom_line(gradient: dict[str, Any], n_layer: int, digits: int, width: int) -> list[str]:
    """The lesson's question: how much of the gradient at the top of the stack reaches block 0."""
    blocks = gradient["blocks"]
    if len(blocks) != n_layer:  # one block shown (--block): no bottom and top to set side by side
        return []
    last = blocks[-1]["stages"]
    if OUTPUT in last:
        top, where = last[OUTPUT]["norm"], f"block {n_layer - 1}'s output"
    elif gradient.get(FINAL_READ) is not None:  # Attention Residuals: the top is what the final norm reads
        top, where = gradient[FINAL_READ]["norm"], FINAL_READ
    else:  # Attention Residuals: the last sublayer's output
        name = FFN if FFN in last else ATTENTION
        top, where = last[name]["norm"], f"block {n_layer - 1}'s {name}"
    bottom = gradient[INPUT]["norm"]
    ratio = f" (bottom / top = {magnitude(bottom / top, digits)})" if top > 0 else ""
    return _pack(
        [
            "gradient from the top of the stack to the bottom:",
            f"{GRAD} of {where} {magnitude(top, digits)},",
            f"of block 0's input {magnitude(bottom, digits)}{ratio}",
        ],
        width,
        " ",
    )


def _formulas(model: dict[str, Any]) -> dict[str, str]:
    """What each stage of a block is, in the stages' names, for the model as built: no `+` without
    the residual, no FFN stages without an FFN, `norm1 = input` where the norm is the identity
    (`norm = "none"`); post-norm's output is its norm2."""
    kind = model["norm"]
    norm = {"layernorm": "LN", "rmsnorm": "RMS"}.get(kind, "")
    b1, b2 = (" + b1", " + b2") if model["bias"] or model.get("ffn_bias") else ("", "")
    skip = model.get("residual", True)
    # grouped-query attention: query heads share key and value heads
    mha = "GQA" if model.get("n_kv_head", model.get("n_head")) != model.get("n_head") else "MHA"
    ffn = model.get("ffn_hidden", 1) > 0

    def normed(which: str, x: str) -> str:
        return x if kind == "none" else f"{norm}{which}({x})"

    def add(stream: str, update: str) -> str:
        return f"{stream} + {update}" if skip else update

    def hidden(x: str) -> str:
        if model["activation"] == "swiglu":  # W1 holds the gate and value projections side by side
            return f"SiLU(gate) * value, [gate | value] = {x} W1{b1}"
        return f"{model['activation']}({x} W1{b1})"

    if model.get("residual") == "attention":  # Attention Residuals: each sublayer reads a mix over depth
        formulas = {
            READ1: depth_mix("depth1"),
            NORM1: normed("1", READ1),
            ATTENTION: f"{mha}({NORM1})",
            READ2: depth_mix("depth2"),
            NORM2: normed("2", READ2),
            HIDDEN: hidden(NORM2),
            FFN: f"{HIDDEN} W2{b2}",
        }
    elif model["norm_position"] == "pre":
        formulas = {
            NORM1: normed("1", INPUT),
            ATTENTION: f"{mha}({NORM1})",
            RESIDUAL1: add(INPUT, ATTENTION),
            NORM2: normed("2", RESIDUAL1),
            HIDDEN: hidden(NORM2),
            FFN: f"{HIDDEN} W2{b2}",
            OUTPUT: add(RESIDUAL1, FFN) if ffn else RESIDUAL1,
        }
    else:
        formulas = {
            ATTENTION: f"{mha}({INPUT})",
            RESIDUAL1: add(INPUT, ATTENTION),
            NORM1: normed("1", RESIDUAL1),
            HIDDEN: hidden(NORM1),
            FFN: f"{HIDDEN} W2{b2}",
            RESIDUAL2: add(NORM1, FFN),
            NORM2: normed("2", RESIDUAL2),
            OUTPUT: NORM2 if ffn else NORM1,
        }
    depth = model.get("residual") == "attention"
    return {stage: formulas[stage] for stage in block_stages(model["norm_position"], ffn, depth)}


def depth_mix(query: str) -> str:
    """An Attention Residuals read (model/depth.py): the softmax over the sources v_i of the query's
    dot product with each source's RMS-normed row (no gain), and the mix of the sources themselves."""
    return f"sum_i a_i v_i, a = softmax_i({query}.query . v_i / rms(v_i))"


# What the sources of an Attention Residuals read are, under the legend.
DEPTH_SOURCES = (
    "v_i: the sources each read weighs, the embedding and the earlier sublayers' outputs (summed in "
    "groups with attention_residual_blocks), named under each block's depth weights"
)


def _legend(model: dict[str, Any]) -> list[str]:
    """One formula per stage, in the order the block computes them (stages.py), in the stages' names
    (`_formulas`)."""
    formulas = _formulas(model)
    if model["norm_position"] == "post" and NORM2 in formulas:  # post-norm's output is LN2's: one line names both
        del formulas[OUTPUT]
        formulas[NORM2] = f"{OUTPUT} = {formulas[NORM2]}"
    steps = [f"{stage} = {formula}" for stage, formula in formulas.items()]
    steps = [step + ";" for step in steps[:-1]] + [steps[-1]]
    if model.get("residual") == "attention":
        return [f"{model['norm_position']}-norm block, Attention Residuals:"] + steps  # a read's formula is long
    return [f"{model['norm_position']}-norm block: {steps[0]}"] + steps[1:]


def positions_note(model: dict[str, Any], json_at: str = "the trace's JSON") -> str | None:
    """Where positions enter a model whose stream carries none (rope, alibi): one sentence, for
    the trace's text and the explore page (`json_at`: what holds the trace's JSON there); None for a
    learned table (its row is in block 0's input table) and for none (no position enters at all)."""
    if model["positions"] == "rope":
        return (
            f"rope: queries and keys turned by their position inside attention (rope_theta "
            f"{model['rope_theta']:g}; {json_at} has the rotated rows)"
        )
    if model["positions"] == "alibi":
        slopes = ", ".join(f"{s:.4g}" for s in alibi_slopes(model["n_head"]))
        return f"alibi: -slope x distance added to each head's scores inside attention (slopes {slopes})"
    return None


def _depth_lines(reads: list[dict[str, Any]], p: int, digits: int, width: int, which: str = "") -> list[str]:
    """Attention Residuals: each read's weights at the traced position, one line (wrapped) a layer:
    which sources it read and how much of each, and their sum (1, up to rounding). `which`: the
    pass, in a comparison ("before", "after")."""
    if not reads:
        return []
    heading = f"depth weights{' ' + which if which else ''} at position {p}"
    out = ["  " + line for line in _pack([heading, "(softmax over each read's sources, sum 1):"], width - 2, " ")]
    for read in reads:
        final = read["reader"] == FINAL_NORM
        said = f"{FINAL_NORM} reads" if final else f"layer {read['layer']} ({read['reader']}) reads"
        items = [f"{source} {number(w, digits)}," for source, w in zip(read["sources"], read["weights"])]
        items[-1] = items[-1].rstrip(",") + ";"
        lines = _pack([said, *items, f"sum {number(read['total'], digits)}"], width - 4, " ")
        out += ["    " + lines[0]] + ["      " + line for line in lines[1:]]
    return out


def kv_group(model: dict[str, Any]) -> int:
    """Query heads per key and value head: 1, or n_head / n_kv_head with grouped-query attention,
    where query head h reads key and value head h // kv_group."""
    return model["n_head"] // model.get("n_kv_head", model["n_head"])


def _attention_lines(
    entry: dict[str, Any], tokens: list[str], p: int, digits: int, width: int, group: int = 1
) -> list[str]:
    """`group`: query heads per key and value head (kv_group); above 1 each column also names the
    kv head its query head reads."""
    weights = entry["attention_weights"]  # [head][key]
    heads = len(weights)
    key_w = max(3, len(str(p)))
    shown = [show_token(tokens[k]) for k in range(p + 1)]
    tok_w = max(5, max(len(s) for s in shown))
    col_w = max(len(f"head {heads - 1}"), digits + 2)
    per_line = max(1, (width - 4 - key_w - 2 - tok_w) // (col_w + 2))
    heading = [f"attention weights {_shape(entry['attention_shape'])}:", f"position {p} over the keys it can see"]
    if group > 1:
        heading += ["(query", "head", "h", "reads", "kv", "head", f"h // {group})"]
    out = ["  " + line for line in _pack(heading, width - 2, " ")]
    for first in range(0, heads, per_line):
        group_shown = range(first, min(heads, first + per_line))
        out.append(
            f"    {'key':>{key_w}}  {'token':<{tok_w}}" + "".join(f"  {f'head {h}':>{col_w}}" for h in group_shown)
        )
        if group > 1:  # the kv head each query head reads, under its name
            kv = "".join(f"  {f'kv {h // group}':>{col_w}}" for h in group_shown)
            out.append(f"    {'':>{key_w}}  {'':<{tok_w}}" + kv)
        for k in range(p + 1):
            out.append(
                f"    {k:>{key_w}}  {shown[k]:<{tok_w}}"
                + "".join(f"  {number(weights[h][k], digits):>{col_w}}" for h in group_shown)
            )
    return out


def render_text(result: Trace, digits: int = 4, width: int = WIDTH) -> str:
    trace = result.as_dict()
    p, ids, tokens, model = trace["position"], trace["ids"], trace["tokens"], trace["model"]
    out = _pack(
        [
            f"trace of position {p}",
            f"(token {show_token(tokens[p])}, id {ids[p]})",
            f"in a prompt of {len(ids)} token(s)",
        ],
        width,
        " ",
    )
    about = [
        f"model: {model['n_layer']} block(s),",
        f"{model['n_head']} heads,",
        *([f"{model['n_kv_head']} kv heads,"] if kv_group(model) > 1 else []),
        *([f"head width {model['head_width']},"] if model.get("head_width") else []),
        f"width {model['n_embd']},",
        f"FFN {model['ffn_hidden']},",
        f"{model['vocab_size']} tokens,",
        model["dtype"],
    ]
    if model["tie_embeddings"]:
        about[-1] += ","
        about.append("tied head")
    out += _pack(about, width, " ")
    if trace.get("interventions"):
        out += _pack(
            ["interventions (the rows below are the modified pass):"] + trace["interventions"],
            width,
            " ",
        )
    listed = _pack([f"{i}:{show_token(t)}" for i, t in enumerate(tokens)], width - 9, "  ")
    out += ["tokens:  " + listed[0]] + ["         " + line for line in listed[1:]]
    legend = _pack(_legend(model), width - 2, " ")
    out += [legend[0]] + ["  " + line for line in legend[1:]]
    if model.get("residual") == "attention":
        sources = _pack(DEPTH_SOURCES.split(" "), width - 2, " ")
        out += ["  " + line for line in sources]
    note = positions_note(model)
    if note is not None:  # rope, alibi: block 0's input is the token row alone, positions enter later
        lines = _pack(note.split(" "), width - 2, " ")
        out += [lines[0]] + ["  " + line for line in lines[1:]]
    every = trace.get("all_positions")
    if every:
        out += _pack(
            [
                "rows: every position of each recorded stage;",
                f"attention weights and next tokens: position {p};",
                "shape: the whole array",
            ],
            width,
            " ",
        )
    else:
        out.append(f"rows: position {p} of each recorded stage; shape: the whole array")
    gradient = trace.get("gradient")
    if gradient is not None:
        out += _gradient_lines(gradient, p, digits, width)

    for k, entry in enumerate(trace["blocks"]):
        i = entry["index"]
        if every:
            out += ["", f"block {i} of {model['n_layer']}"]
            out += _every_position_table(trace, entry, digits, width)
            out += _depth_lines(entry.get("depth", []), p, digits, width)
            out += _attention_lines(entry, tokens, p, digits, width, kv_group(model))
            continue
        rows, grads = [], []
        if i == 0 and trace["input"].get("replaced"):  # set-input: the row given, not token + position
            rows.append((f"{INPUT} (set)", trace["input"]["row"], trace["input"]["shape"]))
        elif i == 0:
            inp = trace["input"]
            rows.append((f"token {show_token(tokens[p], 8)}", inp["token_row"], inp["token_table_shape"]))
            if inp.get("position_row") is not None:  # positions = "none": no position row to add
                rows.append((f"+ position {p}", inp["position_row"], inp["position_table_shape"]))
            grads = [None] * len(rows)  # the gradient is the input's: one sum, one row of it
            rows.append((f"= {INPUT}", inp["row"], inp["shape"]))
        elif entry.get("input") is not None:  # Attention Residuals: no one row enters a block past the first
            rows.append((INPUT, entry["input"]["row"], entry["input"]["shape"]))
        rows += [(name, row, entry["shapes"][name]) for name, row in entry["stages"].items()]
        if gradient is not None:
            block = gradient["blocks"][k]
            entering = [block["input"]["norm"]] if entry.get("input") is not None else []
            grads += entering + [block["stages"][name]["norm"] for name in entry["stages"]]
        out += ["", f"block {i} of {model['n_layer']}"]
        heading = ("stage", f"row at position {p}", "shape")
        out += _table(rows, digits, width, heading=heading, grads=grads if gradient is not None else None)
        out += _depth_lines(entry.get("depth", []), p, digits, width)
        out += _attention_lines(entry, tokens, p, digits, width, kv_group(model))

    out += ["", "after the last block"]
    final = [(FINAL_NORM, trace["final_norm"]["row"], trace["final_norm"]["shape"])]
    read = trace.get("final_read")  # Attention Residuals: the mix over depth the final norm reads
    if every:
        final_rows = [(FINAL_NORM, every[FINAL_NORM], trace["final_norm"]["shape"])]
        if read is not None:
            final_rows.insert(0, (FINAL_READ, every[FINAL_READ], read["shape"]))
        out += _positions_table(final_rows, tokens, digits, width)
    else:
        grads = None if gradient is None else [gradient["final_norm"]["norm"]]
        if read is not None:
            final.insert(0, (FINAL_READ, read["row"], read["shape"]))
            if grads is not None:
                grads.insert(0, gradient[FINAL_READ]["norm"] if gradient.get(FINAL_READ) else None)
        out += _table(final, digits, width, grads=grads)
    if read is not None:
        out += _pack(f"{FINAL_READ} = {depth_mix('final_depth')}".split(" "), width - 2, " ")
        out += _depth_lines([trace["final_depth"]], p, digits, width)
    if gradient is not None:
        out += _bottom_line(gradient, model["n_layer"], digits, width)
    out.append(f"next token after position {p}: softmax({FINAL_NORM} row @ head), top {len(trace['next_tokens'])}")
    tok_w = max([5] + [len(show_token(c["token"])) for c in trace["next_tokens"]])
    id_w = max(2, len(str(model["vocab_size"] - 1)))
    num_w = max(len("probability"), max(len(number(c["logit"], digits)) for c in trace["next_tokens"]))
    out.append(f"  {'rank':>4}  {'id':>{id_w}}  {'token':<{tok_w}}  {'logit':>{num_w}}  {'probability':>{num_w}}")
    for rank, c in enumerate(trace["next_tokens"], 1):
        out.append(
            f"  {rank:>4}  {c['id']:>{id_w}}  {show_token(c['token']):<{tok_w}}  "
            f"{number(c['logit'], digits):>{num_w}}  {number(c['probability'], digits):>{num_w}}"
        )

    if read is None:
        out += [
            "",
            "logit lens: each block's output row, through final_norm and the head, softmax:",
            "what the model would predict if it stopped after that block",
        ]
    else:  # no block leaves an output row: the final norm's own read over what was written by then
        out += [""] + _pack(
            (
                "logit lens: the final norm's read over depth (final_depth.query) of the embedding and the "
                "sublayers' outputs up to each block, through final_norm and the head, softmax: what the "
                "model would predict if it stopped after that block"
            ).split(" "),
            width,
            " ",
        )
    for entry in trace["blocks"]:
        label = f"  block {entry['index']:<3} "
        guesses = [f"{show_token(c['token'])} {number(c['probability'], digits)}" for c in entry["logit_lens"]]
        lines = _pack(guesses, width - len(label), "   ")
        out.append(label + lines[0])
        out.extend(" " * len(label) + line for line in lines[1:])
    return "\n".join(out)


def _every_position_table(trace: dict[str, Any], entry: dict[str, Any], digits: int, width: int) -> list[str]:
    """One block's row stages at every position: `  stage  position token  row  shape`, a stage's
    rows one line each (block 0 first: the token rows and position rows its input adds)."""
    every, i = trace["all_positions"], entry["index"]
    entries = []  # (label, [T rows], shape)
    if i == 0:
        inp = trace["input"]
        entries.append(("token", every["token_rows"], inp["token_table_shape"]))
        if "position_rows" in every:
            entries.append(("+ position", every["position_rows"], inp["position_table_shape"]))
        entries.append((f"= {INPUT}", every[INPUT], inp["shape"]))
    elif entry.get("input") is not None:  # Attention Residuals: no one row enters a block past the first
        entries.append((INPUT, every[f"blocks.{i - 1}.{OUTPUT}"], entry["input"]["shape"]))
    entries += [(name, every[f"blocks.{i}.{name}"], entry["shapes"][name]) for name in entry["stages"]]
    out = _positions_table(entries, trace["tokens"], digits, width)
    if i == 0 and trace["input"].get("replaced"):
        out.append(f"  ({INPUT} at position {trace['position']}: set by set-input, not token + position)")
    return out


def _positions_table(
    entries: list[tuple[str, list[list[float]], list[int]]], tokens: list[str], digits: int, width: int
) -> list[str]:
    """`(label, rows at every position, shape)` entries as a table, one line per position."""
    at = [f"{t} {show_token(token, 8)}" for t, token in enumerate(tokens)]
    label_w = max(len("stage"), *(len(label) for label, _, _ in entries))
    at_w = max(len("position"), *(len(a) for a in at))
    shape_w = max(len(_shape(shape)) for _, _, shape in entries)
    room = width - 2 - label_w - 2 - at_w - 2 - 2 - shape_w
    cells = [(label, [row_lines(row, digits, room) for row in rows], _shape(shape)) for label, rows, shape in entries]
    row_w = max(len("row"), *(len(lines[0]) for _, rows, _ in cells for lines in rows))
    out = [f"  {'stage':<{label_w}}  {'position':<{at_w}}  {'row':<{row_w}}  shape"]
    for label, rows, shape in cells:
        for t, lines in enumerate(rows):
            first = f"  {label if t == 0 else '':<{label_w}}  {at[t]:<{at_w}}  {lines[0]:<{row_w}}  "
            out.append((first + (shape if t == 0 else "")).rstrip())
            out.extend(f"  {'':<{label_w}}  {'':<{at_w}}  {line}" for line in lines[1:])
    return out


def _gradient_comparison(result: Comparison, label_w: int, num_w: int, digits: int, width: int) -> list[str]:
    """Each pass's gradient norms, stage by stage: both of the loss of one target."""
    before, after = result.before.as_dict()["gradient"], result.after.as_dict()["gradient"]
    out = [""] + _gradient_lines(before, result.before.position, digits, width, after)
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
        out += _pack(
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
        out += _pack(["[model] differs, before -> after:", *differing], width, " ")
    return out


def render_comparison(result: Comparison, digits: int = 4, width: int = WIDTH) -> str:
    """Both passes side by side, stage by stage at the traced position: the rows (cut to fit),
    their norms and the norm of the change; then the top next tokens before and after, and the KL
    divergence between the two next-token distributions. Two runs compared: which run each pass
    is, first."""
    before, after = result.before, result.after
    p, tokens = before.position, before.tokens
    out = _pack(
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
        out += _pack(["interventions:", *listed], width, " ")
    else:
        if result.compared_run is not None:
            out += _runs_compared(result, width)
        else:
            out += _prompts_compared(result, width)
        if listed:
            out += _pack(["interventions, in both passes:", *listed], width, " ")
    label_w = max(len("stage"), *(len(name) for block in result.stages for name in block))
    num_w = max(len("|before|"), digits + 4)
    room = width - 4 - len("before  ")
    # Blocks that compute in different orders (pre-norm beside post-norm): each row says what it is.
    orders = before.model["norm_position"] != after.model["norm_position"]
    said = (_formulas(before.model), _formulas(after.model)) if orders else ({}, {})
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
            out += _depth_lines([asdict(read) for read in trace.blocks[k].depth], p, digits, width, which)
    for which, trace in (("before", before), ("after", after)):
        if trace.final_depth is not None:
            out += ["", f"after the last block ({which})"]
            out += _depth_lines([asdict(trace.final_depth)], p, digits, width, which)
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
    out = _pack([f"{where} ({kind}), the model's own module,", f"on x = {given}"], width, " ")
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
            out + _pack(f"{recorded}: recorded inside the model's {name} module as it ran".split(" "), width, " ")
        )
    said = (
        f"{', '.join(worked)}: chapter 17.3's formula, worked from the module's parameters; {name}: the module's output"
    )
    if fed.agrees:
        said += ", which the formula gives too"
    else:
        said += f"; the formula's result differs from it by {magnitude(fed.difference, digits)}"
    return "\n".join(out + _pack(said.split(" "), width, " "))
