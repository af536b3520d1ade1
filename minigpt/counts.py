"""Where a model's parameters are, part by part, each count with the formula it comes from
(`minigpt info`; memory.py sums them for its estimates, flops.py turns them into arithmetic).

Worked out from the [model] section and the vocabulary alone: no tensor is built to count them,
and no torch is imported. The formulas are written in the model's sizes:

    D  the width (n_embd)            F  the FFN's hidden width (ffn_hidden)
    V  the vocabulary (rows of the token table and of the head)
    context  the rows of the position table     T  the positions a pass reads (flops.py)
    d  one attention head's width (head_width, or D / n_head)

Attention's four matrices are D² each while its heads split the width (n_head d = D) and every
query head has its own key and value head; otherwise (grouped-query attention, `[model]
n_kv_head`, or a `head_width` of its own) they are written in Dd with the heads as coefficients:
W_Q and W_O n_head Dd, W_K and W_V n_kv_head Dd each.

A formula is kept as its terms (4D² + 4D is {D²: 4, D: 4}), so a sum of parts has a formula too,
and every count shown is its formula's value: the two cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .config import ModelConfig, Residual

# The symbols a formula is written in, in the order it lists them.
TERMS = ("D²", "Dd", "DF", "VD", "context·D", "buckets·H", "TD", "Td", "F", "D", "d")
# The terms that are weight matrices inside a block: D² or Dd (attention's four) and DF (the FFN's two).
MATRIX_TERMS = ("D²", "Dd", "DF")


@dataclass(frozen=True)
class Sizes:
    """The values the symbols stand for."""

    D: int
    F: int
    V: int
    context: int
    T: int
    d: int = 0  # a head's width, where attention is written in Dd (grouped_attention); 0: not used
    buckets: int = 0  # positions = "t5": its buckets of distance, a bias per head each
    H: int = 0  # and the heads they bias

    def of(self, term: str) -> int:
        return {
            "D²": self.D * self.D,
            "Dd": self.D * self.d,
            "DF": self.D * self.F,
            "VD": self.V * self.D,
            "context·D": self.context * self.D,
            "buckets·H": self.buckets * self.H,
            "TD": self.T * self.D,
            "Td": self.T * self.d,
            "F": self.F,
            "D": self.D,
            "d": self.d,
        }[term]


@dataclass(frozen=True)
class Formula:
    """A sum of terms with whole coefficients: {"D²": 4, "D": 4} is 4D² + 4D."""

    terms: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def of(**coefficients: int) -> Formula:
        """Formula.of(DD=4, D=4): `DD` is D², `contextD` context·D, `bucketsH` buckets·H, `DF`, `VD`, `TD`,
        `Dd`, `Td`, `F`, `D`, `d` the others."""
        names = {"DD": "D²", "contextD": "context·D", "bucketsH": "buckets·H"}
        return Formula._normal({names.get(k, k): v for k, v in coefficients.items()})

    @staticmethod
    def _normal(coefficients: dict[str, int]) -> Formula:
        return Formula(tuple((t, coefficients[t]) for t in TERMS if coefficients.get(t)))

    def __add__(self, other: Formula) -> Formula:
        total = dict(self.terms)
        for term, k in other.terms:
            total[term] = total.get(term, 0) + k
        return Formula._normal(total)

    def __mul__(self, factor: int) -> Formula:
        return Formula._normal({t: k * factor for t, k in self.terms})

    __rmul__ = __mul__

    def coefficient(self, term: str) -> int:
        return dict(self.terms).get(term, 0)

    def only(self, *terms: str) -> Formula:
        return Formula._normal({t: k for t, k in self.terms if t in terms})

    def value(self, sizes: Sizes) -> int:
        return sum(k * sizes.of(t) for t, k in self.terms)

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        return " + ".join(f"{'' if k == 1 else k}{t}" for t, k in self.terms)


def total_formula(formulas: Iterable[Formula]) -> Formula:
    return sum(formulas, Formula())


@dataclass(frozen=True)
class Part:
    """One part: its name (the model's: `token_table`, `attention.W_Q`, `ffn.W1`), its formula,
    and a few words on what the formula counts."""

    name: str
    formula: Formula
    says: str = ""


@dataclass(frozen=True)
class Counts:
    """A model's parts in the order a token meets them: the tables, one block (every block is the
    same shape), `n_layer` times, then what comes after the blocks. Parameters here; flops.py
    builds the arithmetic of a pass in the same shape."""

    sizes: Sizes
    before: tuple[Part, ...]
    block: tuple[Part, ...]
    n_layer: int
    after: tuple[Part, ...]

    def count(self, part: Part | Formula) -> int:
        return (part.formula if isinstance(part, Part) else part).value(self.sizes)

    def group(self, prefix: str) -> Formula:
        """One block's parts whose name starts with `prefix` ("attention.", "ffn.", "norm"), summed."""
        return total_formula(p.formula for p in self.block if p.name.startswith(prefix))

    @property
    def block_formula(self) -> Formula:
        return total_formula(p.formula for p in self.block)

    @property
    def formula(self) -> Formula:
        """The whole model's formula (the blocks' n_layer times)."""
        return total_formula(p.formula for p in self.parts())

    @property
    def total(self) -> int:
        return self.count(self.formula)

    def parts(self) -> Iterator[Part]:
        """Every part once, the block's n_layer times over (as one part each, multiplied)."""
        yield from self.before
        for p in self.block:
            yield Part(p.name, p.formula * self.n_layer, p.says)
        yield from self.after


def sizes_of(cfg: ModelConfig, vocab_size: int, positions: int | None = None) -> Sizes:
    """The symbols' values for a model; `positions` (T) defaults to its context."""
    T = cfg.context if positions is None else positions
    d = cfg.resolved_head_width if grouped_attention(cfg) else 0
    t5 = cfg.positions == "t5"
    return Sizes(
        cfg.n_embd, cfg.ffn_hidden, vocab_size, cfg.context, T, d, cfg.t5_buckets if t5 else 0, cfg.n_head if t5 else 0
    )


def grouped_attention(cfg: ModelConfig) -> bool:
    """Whether attention's matrices are written in Dd, not D²: grouped-query attention (fewer key and
    value heads than query heads), or heads whose widths do not add up to D."""
    return cfg.kv_heads != cfg.n_head or cfg.n_head * cfg.resolved_head_width != cfg.n_embd


def attention_formulas(cfg: ModelConfig) -> dict[str, tuple[Formula, str]]:
    """W_Q, W_K, W_V and W_O's parameters (and a few words): D² and D each where the heads split the
    width and each has its own key and value head; otherwise n_head Dd for W_Q and W_O and n_kv_head
    Dd for W_K and W_V, their biases n_head d, n_kv_head d and D (a bias where [model] gives that
    part one: bias, qkv_bias, out_bias)."""
    qkv, out = (1 if cfg.biased(part) else 0 for part in ("qkv", "out"))
    if not grouped_attention(cfg):
        return {name: (Formula.of(DD=1, D=qkv if name != "W_O" else out), "") for name in ("W_Q", "W_K", "W_V", "W_O")}
    H, K = cfg.n_head, cfg.kv_heads
    shared = f", each read by {H // K} query heads" if K != H else ""
    return {
        "W_Q": (Formula.of(Dd=H, d=H * qkv), f"{H} query heads of width d"),
        "W_K": (Formula.of(Dd=K, d=K * qkv), f"{K} key head{'s' if K != 1 else ''}{shared}"),
        "W_V": (Formula.of(Dd=K, d=K * qkv), f"{K} value head{'s' if K != 1 else ''}"),
        "W_O": (Formula.of(Dd=H, D=out), f"reads the {H} heads, d columns each"),
    }


def norm_formula(cfg: ModelConfig) -> tuple[Formula, str]:
    """A norm's parameters: LayerNorm's gain and bias (2D; D without biases), RMSNorm's gain (D: it
    has no bias by definition), none for norm = "none"."""
    if cfg.norm == "none":
        return Formula(), ""
    if cfg.norm == "layernorm" and cfg.bias:
        return Formula.of(D=2), "gain, bias"
    return Formula.of(D=1), "gain"


def ffn_widen(cfg: ModelConfig) -> int:
    """Columns of W1 per hidden unit: 2 with SwiGLU (a gate and a value), else 1."""
    return 2 if cfg.activation == "swiglu" else 1


def depth_reads(cfg: ModelConfig) -> list[int]:
    """Attention Residuals (`[model] residual = "attention"`, model/depth.py): how many sources each
    read over depth weighs, in the pass's order (every sublayer's read, then the final norm's): the
    embedding, each finished group's sum, and its own group's sum so far once it has one. Empty for
    a model with a residual stream, or without one."""
    if cfg.residual_kind is not Residual.ATTENTION:
        return []
    layers, per_group = cfg.layers, cfg.layers_per_residual_block
    reads = []
    for done in range(layers + 1):  # the layers computed before each read
        finished, partial = divmod(done, per_group)
        reads.append(1 + finished + (1 if partial else 0))
    return reads


def parameter_counts(cfg: ModelConfig, vocab_size: int) -> Counts:
    """MiniGPT(cfg, vocab_size)'s parameters by part, from the shapes model.py gives each layer;
    with Attention Residuals, each sublayer's pseudo-query (D) and the final norm's."""
    bias = 1 if cfg.biased("W1") else 0  # the FFN's: bias, or ffn_bias
    norm, norm_says = norm_formula(cfg)
    depth = cfg.residual_kind is Residual.ATTENTION
    block = [Part("depth1.query", Formula.of(D=1), "attention's read over depth")] if depth else []
    block += [Part("norm1", norm, norm_says)] if norm.terms else []
    for name, (formula, says) in attention_formulas(cfg).items():
        block.append(Part(f"attention.{name}", formula, says))
    if cfg.ffn_hidden:  # ffn_hidden = 0: no norm2 and no FFN at all
        widen = ffn_widen(cfg)
        block += [Part("depth2.query", Formula.of(D=1), "the FFN's read over depth")] if depth else []
        block += [Part("norm2", norm, norm_says)] if norm.terms else []
        block.append(Part("ffn.W1", Formula.of(DF=widen, F=widen * bias), "gate and value" if widen == 2 else ""))
        block.append(Part("ffn.W2", Formula.of(DF=1, D=bias)))
    before = [Part("token_table", Formula.of(VD=1))]
    if cfg.positions == "learned":
        before.append(Part("position_table", Formula.of(contextD=1)))
    if cfg.positions == "t5":  # one table of biases for every block: a bias per head and bucket of distance
        before.append(Part("relative_bias", Formula.of(bucketsH=1), "T5's, shared by every block"))
    after = [Part("final_depth.query", Formula.of(D=1), "the final norm's read over depth")] if depth else []
    after += [Part("final_norm", norm, norm_says)] if norm.terms else []
    tied = cfg.tie_embeddings
    after.append(Part("head", Formula() if tied else Formula.of(VD=1), "tied: token_table" if tied else ""))
    return Counts(sizes_of(cfg, vocab_size), tuple(before), tuple(block), cfg.n_layer, tuple(after))


def block_matrices(counts: Counts) -> int:
    """The entries of the blocks' weight matrices (what Muon trains; biases and gains are not)."""
    return counts.count(counts.block_formula.only(*MATRIX_TERMS) * counts.n_layer)
