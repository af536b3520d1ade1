"""The text view of one traced pass: tables that fit an 80-column terminal, with the numbers at a
chosen number of decimals (text_format.py). It lays out exactly the data of `Trace.to_json()`. With a
gradient (`grad`), each row's `|grad|` column is the norm the gradient computed (gradients.py).
"""

from __future__ import annotations

from typing import Any

from ..model.stages import ATTENTION, FFN, FINAL_NORM, FINAL_READ, INPUT, OUTPUT
from .gradients import GIVEN, PREDICTION, PROMPT
from .legend_text import DEPTH_SOURCES, depth_mix, ffn_bias_note, legend_lines, positions_note
from .text_format import WIDTH, magnitude, number, pack, row_lines, shape_text, show_token
from .trace import Trace

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
    shape_w = max([len(shape_text(shape)) for _, _, shape in rows] + ([len(heading[2])] if heading and grads else []))
    shown = [] if grads is None else ["" if g is None else magnitude(g, digits) for g in grads]
    grad_w = max([len(GRAD)] + [len(g) for g in shown]) if grads is not None else 0
    room = width - 2 - label_w - 2 - 2 - shape_w - (2 + grad_w if grads is not None else 0)
    cells = [(label, row_lines(row, digits, room), shape_text(shape)) for label, row, shape in rows]
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


def gradient_lines(
    gradient: dict[str, Any], p: int, digits: int, width: int, after: dict[str, Any] | None = None
) -> list[str]:
    """What the `|grad|` column is the norm of: the loss, its target and where that came from (with
    `after`, the modified pass's gradient of the same loss, a comparison's)."""
    target = show_token(gradient["target"])
    loss = f"{number(gradient['loss'], digits)} nats"
    if after is not None:
        loss += f" before, {number(after['loss'], digits)} after"
    return pack(
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
    return pack(
        [
            "gradient from the top of the stack to the bottom:",
            f"{GRAD} of {where} {magnitude(top, digits)},",
            f"of block 0's input {magnitude(bottom, digits)}{ratio}",
        ],
        width,
        " ",
    )


def depth_lines(reads: list[dict[str, Any]], p: int, digits: int, width: int, which: str = "") -> list[str]:
    """Attention Residuals: each read's weights at the traced position, one line (wrapped) a layer:
    which sources it read and how much of each, and their sum (1, up to rounding). `which`: the
    pass, in a comparison ("before", "after")."""
    if not reads:
        return []
    heading = f"depth weights{' ' + which if which else ''} at position {p}"
    out = ["  " + line for line in pack([heading, "(softmax over each read's sources, sum 1):"], width - 2, " ")]
    for read in reads:
        final = read["reader"] == FINAL_NORM
        said = f"{FINAL_NORM} reads" if final else f"layer {read['layer']} ({read['reader']}) reads"
        items = [f"{source} {number(w, digits)}," for source, w in zip(read["sources"], read["weights"])]
        items[-1] = items[-1].rstrip(",") + ";"
        lines = pack([said, *items, f"sum {number(read['total'], digits)}"], width - 4, " ")
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
    heading = [f"attention weights {shape_text(entry['attention_shape'])}:", f"position {p} over the keys it can see"]
    if group > 1:
        heading += ["(query", "head", "h", "reads", "kv", "head", f"h // {group})"]
    out = ["  " + line for line in pack(heading, width - 2, " ")]
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
    out = pack(
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
    out += pack(about, width, " ")
    if trace.get("interventions"):
        out += pack(
            ["interventions (the rows below are the modified pass):"] + trace["interventions"],
            width,
            " ",
        )
    listed = pack([f"{i}:{show_token(t)}" for i, t in enumerate(tokens)], width - 9, "  ")
    out += ["tokens:  " + listed[0]] + ["         " + line for line in listed[1:]]
    legend = pack(legend_lines(model), width - 2, " ")
    out += [legend[0]] + ["  " + line for line in legend[1:]]
    biases = ffn_bias_note(model)
    if biases is not None:  # a SwiGLU FFN's + b1, beside a config's ffn_bias = false
        out += ["  " + line for line in pack(biases.split(" "), width - 2, " ")]
    if model.get("residual") == "attention":
        sources = pack(DEPTH_SOURCES.split(" "), width - 2, " ")
        out += ["  " + line for line in sources]
    note = positions_note(model)
    if note is not None:  # rope, alibi: block 0's input is the token row alone, positions enter later
        lines = pack(note.split(" "), width - 2, " ")
        out += [lines[0]] + ["  " + line for line in lines[1:]]
    every = trace.get("all_positions")
    if every:
        out += pack(
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
        out += gradient_lines(gradient, p, digits, width)

    for k, entry in enumerate(trace["blocks"]):
        i = entry["index"]
        if every:
            out += ["", f"block {i} of {model['n_layer']}"]
            out += _every_position_table(trace, entry, digits, width)
            out += depth_lines(entry.get("depth", []), p, digits, width)
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
        out += depth_lines(entry.get("depth", []), p, digits, width)
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
        out += pack(f"{FINAL_READ} = {depth_mix('final_depth')}".split(" "), width - 2, " ")
        out += depth_lines([trace["final_depth"]], p, digits, width)
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
        out += [""] + pack(
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
        lines = pack(guesses, width - len(label), "   ")
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
    shape_w = max(len(shape_text(shape)) for _, _, shape in entries)
    room = width - 2 - label_w - 2 - at_w - 2 - 2 - shape_w
    cells = [
        (label, [row_lines(row, digits, room) for row in rows], shape_text(shape)) for label, rows, shape in entries
    ]
    row_w = max(len("row"), *(len(lines[0]) for _, rows, _ in cells for lines in rows))
    out = [f"  {'stage':<{label_w}}  {'position':<{at_w}}  {'row':<{row_w}}  shape"]
    for label, rows, shape in cells:
        for t, lines in enumerate(rows):
            first = f"  {label if t == 0 else '':<{label_w}}  {at[t]:<{at_w}}  {lines[0]:<{row_w}}  "
            out.append((first + (shape if t == 0 else "")).rstrip())
            out.extend(f"  {'':<{label_w}}  {'':<{at_w}}  {line}" for line in lines[1:])
    return out
