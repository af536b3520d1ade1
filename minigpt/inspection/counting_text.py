"""`minigpt info`'s report as text: an Info (counting.py) in tables that fit 80 columns, each count
beside its formula."""

from __future__ import annotations

import textwrap
from typing import Any

from ..counts import MATRIX_TERMS, Counts, Formula, block_matrices
from ..memory import DTYPE_BYTES, width_rows
from ..model.flops import TRAINING_FLOPS
from .counting import Info

WIDTH = 80  # the text fits an 80-column terminal; a longer note wraps under its own column


def render_text(info: Info) -> str:
    p, a = info.parameters, info.arithmetic
    s, arch = p.sizes, info.architecture
    lines = [
        f"run {info.run}: {p.n_layer} block{'s' if p.n_layer != 1 else ''}, {arch['n_head']} heads, "
        f"context {s.context}",
        f"  D = {s.D} (n_embd), F = {s.F} (ffn_hidden), V = {s.V:,} (vocabulary)",
        *_heads_lines(arch, s.d),
        *_wrap("  " + _switches(arch), 2),
        "",
        "Parameters",
        *_table(p, "count"),
        *_parameter_shares(info),
        "",
        f"Forward arithmetic per token at T = {a.sizes.T} positions (multiply-adds: 2 FLOPs each)",
        *_wrap(
            "  (a multiply-add for every parameter a token's row meets, biases and gains too; the tables are "
            "looked up, the head multiplies; Q Kᵀ and the weighted sum read T keys)",
            3,
        ),
        *_positions_lines(info),
        *depth_lines(info),
        *_table(a, "mult-adds"),
        *_flops_lines(info),
        "",
        *_memory_lines(info),
        "",
        *_choices_lines(info),
    ]
    return "\n".join(lines)


def _heads_lines(arch: dict[str, Any], d: int) -> list[str]:
    """Attention written in Dd (grouped-query attention, or heads of their own width): d, and which
    key and value head each query head reads."""
    if not d:
        return []
    H = arch["n_head"]
    K = arch.get("n_kv_head", H)
    line = f"  d = {d} (a head's width), {H} query heads, {K} key and value head{'s' if K != 1 else ''}"
    if K != H:
        line += f": query head h reads key and value head h // {H // K} (grouped-query attention)"
    return _wrap(line, 4)


def _switches(arch: dict[str, Any]) -> str:
    norm = "no norms" if arch["norm"] == "none" else f"{arch['norm']} ({arch['norm_position']}-norm)"
    words = [
        norm,
        f"{arch['activation']} FFN" if arch["ffn_hidden"] else "no FFN",
        _biases(arch),
        *_residual(arch),
        "head tied to token_table" if arch["tie_embeddings"] else "separate head",
        POSITIONS[arch["positions"]].format(**arch),
        arch["dtype"],
    ]
    return ", ".join(words)


def _biases(arch: dict[str, Any]) -> str:
    """`bias`, or the parts that have one of their own (qkv_bias, out_bias, ffn_bias) without it."""
    if arch["bias"]:
        return "biases"
    own = [
        part
        for key, part in (("qkv_bias", "W_Q, W_K, W_V"), ("out_bias", "W_O"), ("ffn_bias", "W1, W2"))
        if arch.get(key)
    ]
    return f"biases on {', '.join(own)} only" if own else "no biases"


# `[model] positions` as the summary names it: rope and ALiBi have no table, and no parameters at all
POSITIONS = {
    "learned": "learned positions",
    "none": "no position table",
    "rope": "rotary positions (rope_theta {rope_theta:g}; no parameters)",
    "alibi": "ALiBi positions (no parameters)",
    "sinusoidal": "sinusoidal positions (a fixed table; no parameters)",
    "t5": "T5 relative positions ({t5_buckets} buckets up to distance {t5_max_distance}, shared by every block)",
}


def _residual(arch: dict[str, Any]) -> list[str]:
    """Attention Residuals named in the summary (`[model] residual = "attention"`), full or in blocks."""
    if arch["residual"] != "attention":
        return []
    blocks = arch.get("attention_residual_blocks", 0)
    return [f"Attention Residuals ({f'Block AttnRes, {blocks} blocks' if blocks else 'full'})"]


def _positions_lines(info: Info) -> list[str]:
    """rope's rotation or ALiBi's bias: what it computes per token and block, and that the table
    below leaves it out (elementwise, as the softmax)."""
    extra = info.positions_arithmetic()
    if extra is None:
        return []
    grouped = info.parameters.sizes.d  # rope turns (n_head + n_kv_head) d coordinates, not 2D
    share = info.architecture.get("rope_fraction", 1.0) != 1.0  # r = int(d rope_fraction) of each head turn
    rotated = ("2(H+K)r", "(H+K)r") if share else ("2(H+K)d", "(H+K)d") if grouped else ("4D", "2D")
    amount = (
        f"{rotated[0]} = {extra['multiplies']:,} multiplies and {rotated[1]} = {extra['adds']:,} adds"
        if extra["scheme"] == "rope"
        else f"H·T = {extra['adds']:,} adds"
    )
    return _wrap(
        f"  ({extra['what']}, {amount} per token and block, is elementwise: not counted below, as the softmax is not)",
        3,
    )


def depth_lines(info: Info) -> list[str]:
    """Attention Residuals: what its reads over depth compute per token, counted as depth.reads."""
    depth = info.depth_arithmetic()
    if depth is None:
        return []
    return _wrap(
        f"  (Attention Residuals: {depth['reads']} reads over depth, each sublayer's and the final norm's, weigh "
        f"{depth['sources']} sources in all; a read of S sources is S·D for its query against their keys and S·D "
        f"for their mix, counted as depth.reads; the keys' RMS norm and the softmax are elementwise, not counted)",
        3,
    )


def _table(c: Counts, heading: str) -> list[str]:
    """The parts as rows (name, count, formula, a few words), one block's parts under a row that
    says how many blocks there are; the total's formula may run past the formula column."""

    def row(name: str, formula: Formula, says: str = "") -> tuple[str, str, str, str]:
        return name, f"{c.count(formula):,}", str(formula), says

    rows = [row(f"  {p.name}", p.formula, p.says) for p in c.before]
    blocks = f"  each of the {c.n_layer} blocks" if c.n_layer > 1 else "  the block"
    rows.append(row(blocks, c.block_formula))
    rows += [row(f"    {p.name}", p.formula, p.says) for p in c.block]
    rows += [row(f"  {p.name}", p.formula, p.says) for p in c.after]
    total = row("  total", c.formula)
    name_w = max(len(r[0]) for r in rows)
    count_w = max(len(heading), len(total[1]), *(len(r[1]) for r in rows))
    formula_w = max(len("formula"), *(len(r[2]) for r in rows))
    out = [f"  {'part':<{name_w - 2}}  {heading:>{count_w}}  formula"]
    for name, count, formula, says in [*rows, total]:
        out.append(f"{name:<{name_w}}  {count:>{count_w}}  {formula:<{formula_w}}  {says}".rstrip())
    return out


def _percent(x: float) -> str:
    return "<0.1%" if 0 < x < 0.0005 else f"{100 * x:.1f}%"


def _units(x: float) -> str:
    return f"{x:.0f}" if x == int(x) else f"{x:.2f}"


def _parameter_shares(info: Info) -> list[str]:
    p = info.parameters
    block, model = info.block_shares(), info.model_shares()
    same = "equals" if p.total == info.num_parameters else f"DIFFERS FROM ({info.num_parameters:,})"
    lines = [f"  the total {same} num_parameters(), the model's own count"]
    lines += _wrap(
        f"  one block: attention {_percent(block['attention'])} ({p.group('attention.')}), "
        f"FFN {_percent(block['ffn'])} ({p.group('ffn.') or 'none'}), norms {_percent(block['norms'])}"
        + (f", depth queries {_percent(block['depth_queries'])}" if "depth_queries" in block else ""),
        4,
    )
    if p.sizes.F:
        square = p.sizes.of("D²")
        attention = p.count(p.group("attention.").only(*MATRIX_TERMS)) / square
        ffn = p.count(p.group("ffn.").only(*MATRIX_TERMS)) / square
        per_f = "3F/D" if info.architecture["activation"] == "swiglu" else "2F/D"
        lines += _wrap(
            f"  its matrices in units of D²: attention {_units(attention)}, FFN {_units(ffn)} ({per_f}): the FFN "
            f"holds {_units(ffn)} of {_units(attention + ffn)} (c21: 8D² of 12D² at F = 4D, two thirds)",
            4,
        )
    lines += _wrap(
        f"  the whole model: FFN {_percent(model['ffn'])}, attention {_percent(model['attention'])}, "
        f"norms {_percent(model['norms'])}, "
        + (f"depth queries {_percent(model['depth_queries'])}, " if "depth_queries" in model else "")
        + f"tables and head {_percent(model['tables_and_head'])}",
        4,
    )
    return lines


def _flops_lines(info: Info) -> list[str]:
    u = info.units()
    D = info.arithmetic.sizes.D
    table = "4HTd/D²" if info.arithmetic.sizes.d else "4T/D"  # H query heads of width d each read T keys
    ffn = "6F/D" if info.architecture["activation"] == "swiglu" else "4F/D"
    lines = [
        f"  forward: {info.forward_flops:,} FLOPs per token",
        *_wrap(
            f"  training: {info.training_flops:,} FLOPs per token ({TRAINING_FLOPS} per multiply-add: the "
            "backward pass costs twice the forward; the bench's estimate)",
            4,
        ),
        f"  c21's units: one block's forward FLOPs per token over D² = {D * D:,} (matrices only)",
        f"    Q, K, V and W_O projections  {_units(u['projections']):>5}",
    ]
    if info.parameters.sizes.F:
        lines.append(f"    FFN W1 and W2                {_units(u['ffn']):>5}  ({ffn}; 16 at F = 4D)")
    lines += [
        f"    together                     {_units(u['matrices']):>5}  (c21: 24, of which the FFN 16)",
        f"    attention table, {table:<7}     {_units(u['table']):>5}  (grows with T)",
    ]
    return lines


def _size(n: int) -> str:
    for unit, power in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 2**power:
            return f"{n / 2**power:,.2f} {unit}"
    return f"{n:,} B"


def _memory_lines(info: Info) -> list[str]:
    m, p = info.memory, info.parameters
    dtype = info.architecture["dtype"]
    whence = "recorded" if info.optimizer_from == "recorded" else "what its config would take"
    lines = [
        "Training memory (an estimate)",
        *_wrap(
            f"  {dtype} ({DTYPE_BYTES[dtype]} bytes a number), optimizer {info.optimizer} ({whence}), batch "
            f"{info.batch_size} x {p.sizes.context} positions",
            4,
        ),
    ]
    if info.lora is not None:
        rank, targets = info.lora
        rows = [
            ("weights", m.weights, f"{p.total:,} frozen, and the adapters"),
            (
                "gradients",
                m.gradients,
                f"the {info.adapters:,} parameters of the rank-{rank} LoRA adapters ({targets})",
            ),
            ("optimizer state", m.optimizer_state, "AdamW: two moments per adapter parameter"),
        ]
    else:
        matrices = block_matrices(p)
        state = (
            f"Muon: one momentum for each of the {matrices:,} entries of the blocks' matrices; AdamW: two moments "
            f"for each of the other {p.total - matrices:,} parameters"
            if info.optimizer == "muon"
            else "AdamW: two moments per parameter"
        )
        rows = [
            ("weights", m.weights, f"{p.total:,} parameters"),
            ("gradients", m.gradients, "one per parameter"),
            ("optimizer state", m.optimizer_state, state),
        ]
    rows_kept = width_rows(info.architecture["residual"])
    rows.append(
        (
            "activations",
            m.activations,
            f"what the backward pass keeps: per block and position about {rows_kept} width-sized rows, 3 FFN-sized (5 "
            "with SwiGLU) and the attention weights; the logits 3 times over",
        )
    )
    rows.append(("total", m.total, ""))
    for name, n, says in rows:
        lines += _wrap(f"  {name:<15} {_size(n):>11}  {says}".rstrip(), 31)
    return lines


def _choices_lines(info: Info) -> list[str]:
    asked = info.asked
    if info.choices is None:
        return _wrap(
            "Training's choices: none recorded in its checkpoint (an import, or a run trained before minigpt "
            f"recorded them); its config asks for optimizer {asked['optimizer']!r}, precision "
            f"{asked['precision']!r}, threads {asked['threads']}",
            2,
        )
    c = info.choices
    return [
        f"Training chose (its checkpoint at step {info.choices_step}; the config's ask in brackets)",
        f"  optimizer {c['optimizer']} ({asked['optimizer']!r}), precision {c['precision']} ({asked['precision']!r}),",
        f"  {c['threads']} thread{'s' if c['threads'] != 1 else ''} ({asked['threads']}), "
        f"device {c['device']} ({asked['device']!r})",
        *_measured_lines(c.get("measured")),
    ]


def _measured_lines(measured: dict[str, Any] | None) -> list[str]:
    """The figures `auto` measured before the first step (training/measured.py), where it measured."""
    if not measured:
        return []
    lines = ["  measured on the machine it started on:"]
    if "matmul" in measured:
        m = measured["matmul"]
        rows, inner, outer = m["shape"]
        lines.append(
            f"    a [{rows}, {inner}] x [{inner}, {outer}] matmul: float32 {m['float32_gflops']:,.1f} GFLOP/s, "
            f"bfloat16 {m['bfloat16_gflops']:,.1f}"
        )
    timed = measured.get("pass") or {}
    passes = [f"{p} {timed[f'{p}_s'] * 1e3:.1f} ms" for p in ("float32", "bfloat16") if f"{p}_s" in timed]
    if passes:
        lines.append(f"    a {timed['tokens']}-token forward and backward pass: " + ", ".join(passes))
    if "orthogonalisation_s" in timed:
        lines.append(
            f"    Muon's orthogonalisation of every block matrix: {timed['orthogonalisation_s'] * 1e3:.1f} ms, "
            f"{measured['muon_share']:.0%} of a step's forward and backward"
        )
    return lines


def _wrap(line: str, indent: int) -> list[str]:
    """`line` cut at spaces to the text's width, each further line indented by `indent` spaces."""
    return textwrap.wrap(line, WIDTH, subsequent_indent=" " * indent, drop_whitespace=True) or [line]
