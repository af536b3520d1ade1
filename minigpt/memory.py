"""How many bytes a model needs to be read and run, checked against what the device has before
anything is allocated: a model too large for the machine is refused in one line, instead of the
process being killed half-way through loading it (GPT-2 small is 500 MB of float32 parameters).

The counts are worked out from the [model] section alone, so no tensor is built to count them.
`training_bytes` estimates the other use of a model, training it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import ModelConfig, lora_targets
from .counts import block_matrices, parameter_counts
from .device import available_memory
from .errors import MinigptError

DTYPE_BYTES = {"float32": 4, "float64": 8}
MARGIN = 64 << 20  # the interpreter, torch's own buffers, the tokenizer: a fixed allowance


def parameter_count(cfg: ModelConfig, vocab_size: int) -> int:
    """MiniGPT(cfg, vocab_size).num_parameters(): the sum of counts.py's parts."""
    return parameter_counts(cfg, vocab_size).total


def width_rows(residual: bool | str) -> int:
    """The width-sized rows a block holds per position, about: the stream, norms, q, k, v, attention,
    residuals (12); with Attention Residuals two more, the normed key of each sublayer's output,
    which every later read over depth reads (model/depth.py)."""
    return 12 + (2 if residual == "attention" else 0)


def block_row_elements(cfg: ModelConfig) -> int:
    """The numbers a block holds per position in its width-sized rows (`width_rows`), with q, k and v
    as wide as they are: n_head d for the queries and n_kv_head d each for the keys and values
    (grouped-query attention's are narrower), D each otherwise."""
    d = cfg.resolved_head_width
    return (width_rows(cfg.residual) - 3) * cfg.n_embd + (cfg.n_head + 2 * cfg.kv_heads) * d


def forward_bytes(cfg: ModelConfig, vocab_size: int, positions: int, batch: int = 1, recorded: bool = False) -> int:
    """About what one forward pass over `positions` positions holds at once: per block and
    position the width-sized rows (stream, norms, q, k, v, attention, residuals) and the FFN's
    hidden rows, the attention scores and weights; the logits and their softmax. `recorded` (a
    trace): every block's stages are kept to the end, not only the current block's."""
    F = cfg.ffn_hidden
    widen = 2 if cfg.activation == "swiglu" else 1
    per_block = block_row_elements(cfg) + (widen + 1) * F + 2 * cfg.n_head * positions
    blocks = cfg.n_layer if recorded else 1
    return batch * positions * (blocks * per_block + 2 * vocab_size) * DTYPE_BYTES[cfg.dtype]


# The longest text `reading_bytes` sizes a pass for: an imported model's context may be 131,072
# positions, whose attention weights alone would be hundreds of GiB, and a text is rarely that long.
READ_WINDOW = 4096


def reading_bytes(cfg: ModelConfig, vocab_size: int) -> int:
    """About what loading a model and sampling one sample from it holds: the parameters twice (the
    model, and the checkpoint's tensors it is copied from; past the table, the folded copy that
    recomputes the window), a KV cache through the whole position table, a forward pass over the
    whole table (the recompute past it), and the fixed margin; for a table longer than READ_WINDOW
    positions, the cache and the pass of a READ_WINDOW-token text. The cache holds n_kv_head heads of
    keys and values (grouped-query attention's is smaller). GPT-2 small sampling 1,100 tokens
    peaked at 2.05 GiB resident (the interpreter and torch's libraries included), 1.6 GiB estimated."""
    width = DTYPE_BYTES[cfg.dtype]
    positions = min(cfg.context, READ_WINDOW)
    cache = 2 * cfg.n_layer * positions * cfg.kv_heads * cfg.resolved_head_width * width
    window = forward_bytes(cfg, vocab_size, positions)
    return 2 * parameter_count(cfg, vocab_size) * width + cache + window + MARGIN


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes training holds at once, by what holds them (see `training_memory`)."""

    weights: int
    gradients: int
    optimizer_state: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer_state + self.activations


def training_memory(
    cfg: ModelConfig,
    vocab_size: int,
    batch_size: int,
    optimizer: str,
    lora: tuple[int, str] | None = None,
    recompute: bool = False,
) -> TrainingMemory:
    """About what training holds at once: parameters, gradients and optimizer state (two AdamW
    moments, or one Muon momentum for the blocks' matrices and two for the rest), and one
    micro-batch's activations kept for the backward pass (per block and position: about 12
    width-sized rows, 3 FFN-sized ones, the attention weights; then the logits three times over).
    `optimizer` "auto": whichever it takes, at most AdamW's two moments.
    `lora` (rank, targets): the parameters frozen (no gradient, no state), the adapters trained.
    `recompute`: each block's input kept, and one block's activations at a time."""
    width = DTYPE_BYTES[cfg.dtype]
    hidden = cfg.ffn_hidden * (5 if cfg.activation == "swiglu" else 3)
    block = block_row_elements(cfg) + hidden + 2 * cfg.n_head * cfg.context
    kept = cfg.n_layer * cfg.n_embd + block if recompute else cfg.n_layer * block
    per_position = kept + 3 * vocab_size
    activations = batch_size * cfg.context * per_position * width
    counts = parameter_counts(cfg, vocab_size)
    parameters = counts.total
    if lora is not None:
        adapters = lora_parameter_count(cfg, *lora)
        return TrainingMemory((parameters + adapters) * width, adapters * width, 2 * adapters * width, activations)
    # AdamW: two moments per parameter; Muon: one momentum per entry of the blocks' matrices instead
    state = 2 * parameters - (block_matrices(counts) if optimizer == "muon" else 0)
    return TrainingMemory(parameters * width, parameters * width, state * width, activations)


def training_bytes(
    cfg: ModelConfig,
    vocab_size: int,
    batch_size: int,
    optimizer: str,
    lora: tuple[int, str] | None = None,
    recompute: bool = False,
) -> int:
    """`training_memory`'s total."""
    return training_memory(cfg, vocab_size, batch_size, optimizer, lora, recompute).total


def lora_parameter_count(cfg: ModelConfig, rank: int, targets: str) -> int:
    """The adapters' parameters: r (in + out) per targeted matrix per block (qkv's out is its
    (n_head + 2 n_kv_head) d rows, out's in the n_head d columns of the joined heads)."""
    C, F, d = cfg.n_embd, cfg.ffn_hidden, cfg.resolved_head_width
    widen = 2 if cfg.activation == "swiglu" else 1
    heads = cfg.n_head * d
    shapes = {"qkv": (C, heads + 2 * cfg.kv_heads * d), "out": (heads, C), "W1": (C, widen * F), "W2": (F, C)}
    wanted = [name for name in lora_targets(targets) if F or name in ("qkv", "out")]
    return cfg.n_layer * sum(rank * sum(shapes[name]) for name in wanted)


def check_memory(needed: int, device: str, what: str, advice: str) -> None:
    """Refuse `what` (a phrase: "loading this model and sampling from it") when `device` has less
    than `needed` bytes available; say nothing where the free memory cannot be read."""
    available = available_memory(device)
    if available is not None and needed > available:
        raise MinigptError(
            "{what} needs about {gib} but {device} has {gib2} available; {advice}",
            what=what,
            gib=_gib(needed),
            device=device,
            gib2=_gib(available),
            advice=advice,
        )


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"
