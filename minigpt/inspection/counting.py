"""`minigpt info`'s report: where a run's parameters are, what a forward pass computes per token
and per part, what training it holds in memory, and what its `auto` settings chose.

The counts come from counts.py, the arithmetic from model/flops.py (whose total is the
benchmark's estimate), the memory from memory.py (the estimate `train` checks before it starts);
this module only gathers them for one run, as an Info whose `to_json` is `--json`'s; counting_text.py
lays it out as tables a learner can check by hand against the formulas beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Config
from ..counts import MATRIX_TERMS, Counts, Formula, Part, depth_reads, parameter_counts
from ..errors import MinigptError
from ..memory import DTYPE_BYTES, TrainingMemory, lora_parameter_count, training_memory
from ..model.flops import TRAINING_FLOPS, forward_counts
from ..model.gpt import MiniGPT
from ..runs.checkpoints import load_checkpoint
from ..runs.layout import CHECKPOINT_FILE

# The [train] keys whose `auto` (or 0) training settles, as a checkpoint's `choices` names them.
CHOSEN = ("optimizer", "precision", "threads", "device")


@dataclass
class Info:
    """One run's counts. `choices`: what its last checkpoint recorded that training chose (None for
    an import, or a run trained before minigpt recorded them); `asked`: what its config says."""

    run: Path
    architecture: dict[str, Any]
    parameters: Counts
    arithmetic: Counts
    num_parameters: int  # the model's own count (every tensor's numel), which the parts must add up to
    memory: TrainingMemory
    optimizer: str  # the optimizer the memory estimate is for
    optimizer_from: str  # "recorded" (the checkpoint's choice), or "config" (what training would take)
    lora: tuple[int, str] | None
    adapters: int | None  # a LoRA run's trained parameters
    batch_size: int
    choices: dict[str, Any] | None
    asked: dict[str, Any]
    choices_step: int | None
    # Attention Residuals: the sources each read over depth weighs (counts.depth_reads; empty: none)
    depth_reads: tuple[int, ...] = ()

    # ------------------------------------------------------------ derived numbers

    @property
    def positions(self) -> int:
        return self.arithmetic.sizes.T

    def _kinds(self) -> dict[str, str]:
        """The kinds of a block's parts, by their names' prefix; the depth queries only with
        Attention Residuals."""
        return {**_KINDS, **(_DEPTH if self.architecture.get("residual") == "attention" else {})}

    def block_shares(self) -> dict[str, float]:
        """Each kind of part's share of one block's parameters."""
        p, block = self.parameters, self.parameters.count(self.parameters.block_formula)
        return {kind: p.count(p.group(prefix)) / block for kind, prefix in self._kinds().items()}

    def model_shares(self) -> dict[str, float]:
        """Each kind's share of the whole model's parameters (the blocks' n_layer times over; the
        depth queries with the final norm's); the rest is the tables, the final norm and the head."""
        p = self.parameters
        shares = {kind: p.n_layer * p.count(p.group(prefix)) / p.total for kind, prefix in self._kinds().items()}
        own = ("final_norm", *_AFTER_DEPTH)  # not a table nor the head
        tables_and_head = sum(p.count(part) for part in (*p.before, *p.after) if part.name not in own)
        shares["tables_and_head"] = tables_and_head / p.total
        if "depth_queries" in shares:
            final = sum(p.count(part) for part in p.after if part.name in _AFTER_DEPTH)
            shares["depth_queries"] += final / p.total
        return shares

    def depth_arithmetic(self) -> dict[str, Any] | None:
        """Attention Residuals: its reads over depth (each sublayer's and the final norm's), the
        sources they weigh in all, and their multiply-adds per token (2D a source: the query
        against the source's key, and the source in the mix), the `depth.reads` part of the
        arithmetic. None without Attention Residuals."""
        reads = list(self.depth_reads)
        if not reads:
            return None
        return {
            "reads": len(reads),
            "sources": sum(reads),
            "sources_per_read": reads,
            "multiply_adds": 2 * sum(reads) * self.arithmetic.sizes.D,
        }

    def units(self) -> dict[str, float]:
        """c21's (Megatron-LM's) count: one block's forward FLOPs per token over D², the weight
        matrices alone (biases and gains left out, as the text does): the projections 8, the FFN
        4F/D (16 at F = 4D; 6F/D with SwiGLU), and the attention table's two products with T keys,
        4T/D, the term that grows with T."""
        a = self.arithmetic
        square = a.sizes.of("D²")

        def flops(formula: Formula) -> float:
            return 2 * a.count(formula.only(*MATRIX_TERMS)) / square

        table = 2 * a.count(a.group("attention.scores") + a.group("attention.weighted_sum")) / square
        projections = flops(a.group("attention."))
        ffn = flops(a.group("ffn."))
        return {"projections": projections, "ffn": ffn, "matrices": projections + ffn, "table": table}

    def positions_arithmetic(self) -> dict[str, Any] | None:
        """What rope's rotation or ALiBi's bias computes per token and block, which the counts leave
        out: elementwise, with no parameter met, as the softmax and the scores' scaling are left
        out. rope turns the query and key rows (2D coordinates; (n_head + n_kv_head) d with
        grouped-query attention or heads of their own width), each x cos + rotate_half(x) sin: 2
        multiplies and an add; ALiBi adds one bias to each of a head's T scores. None for a learned
        table (looked up, as the token table is) and for none."""
        scheme, a = self.architecture["positions"], self.arithmetic.sizes
        if scheme == "rope":
            arch = self.architecture
            heads = arch["n_head"] + arch.get("n_kv_head", arch["n_head"])
            # 2D unless grouped, or a share of each head (rope_fraction)
            turned = heads * int(arch.get("head_width", a.D // arch["n_head"]) * arch.get("rope_fraction", 1.0))
            return {
                "scheme": scheme,
                "what": "rope's rotation of each query and key row"
                + (f" (r = {turned // heads} of each head's coordinates)" if "rope_fraction" in arch else ""),
                "multiplies": 2 * turned,
                "adds": turned,
            }
        if scheme in ("alibi", "t5"):  # one bias added to each score (T5's looked up, as a table row is)
            heads = self.architecture["n_head"]
            what = "ALiBi's bias on each score" if scheme == "alibi" else "T5's bias on each score"
            return {"scheme": scheme, "what": what, "multiplies": 0, "adds": heads * a.T}
        return None

    @property
    def forward_flops(self) -> int:
        return 2 * self.arithmetic.total

    @property
    def training_flops(self) -> int:
        return TRAINING_FLOPS * self.arithmetic.total

    # ------------------------------------------------------------ JSON

    def to_json(self) -> dict[str, Any]:
        p, a = self.parameters, self.arithmetic
        return {
            "run": str(self.run),
            "model": self.architecture,
            "parameters": {
                **_counts_json(p),
                "num_parameters": self.num_parameters,
                "shares_of_a_block": self.block_shares(),
                "shares_of_the_model": self.model_shares(),
            },
            "arithmetic": {
                "positions": self.positions,
                "unit": "multiply-adds per token, forward",
                **_counts_json(a),
                "forward_flops_per_token": self.forward_flops,
                "training_flops_per_token": self.training_flops,
                "flops_over_D2_per_block": self.units(),
                # rope's rotation or ALiBi's bias, per token and block: elementwise, not in the counts
                "positions_not_counted": self.positions_arithmetic(),
                # Attention Residuals' reads over depth: counted, as the part depth.reads (null: none)
                "depth_reads": self.depth_arithmetic(),
            },
            "memory": {
                "estimate": True,
                "dtype": self.architecture["dtype"],
                "bytes_per_number": DTYPE_BYTES[self.architecture["dtype"]],
                "batch_size": self.batch_size,
                "context": p.sizes.context,
                "optimizer": self.optimizer,
                "optimizer_from": self.optimizer_from,
                "lora": None if self.lora is None else {"rank": self.lora[0], "targets": self.lora[1]},
                "weights": self.memory.weights,
                "gradients": self.memory.gradients,
                "optimizer_state": self.memory.optimizer_state,
                "activations": self.memory.activations,
                "total": self.memory.total,
            },
            "choices": self.choices,
            "choices_step": self.choices_step,
            "asked": self.asked,
        }


_KINDS = {"attention": "attention.", "ffn": "ffn.", "norms": "norm"}
_DEPTH = {"depth_queries": "depth"}  # Attention Residuals: depth1.query, depth2.query
_AFTER_DEPTH = ("final_depth.query",)


def _counts_json(c: Counts) -> dict[str, Any]:
    def part(p: Part, per_block: bool) -> dict[str, Any]:
        return {"name": p.name, "count": c.count(p), "formula": str(p.formula), "says": p.says, "per_block": per_block}

    return {
        "sizes": {
            "D": c.sizes.D,
            "F": c.sizes.F,
            "V": c.sizes.V,
            "context": c.sizes.context,
            "T": c.sizes.T,
            **({"d": c.sizes.d} if c.sizes.d else {}),  # attention in Dd (counts.grouped_attention)
        },
        "n_layer": c.n_layer,
        "parts": [part(p, False) for p in c.before]
        + [part(p, True) for p in c.block]
        + [part(p, False) for p in c.after],
        "block": {"count": c.count(c.block_formula), "formula": str(c.block_formula)},
        "total": c.total,
        "formula": str(c.formula),
    }


def describe(run_dir: Path, cfg: Config, model: MiniGPT, planned_optimizer: str, positions: int | None = None) -> Info:
    """The counts of a loaded run (`minigpt.load`'s folder, config and model) with its forward
    arithmetic at `positions` (T, default: its context: a pass reads at most that many).
    `planned_optimizer`: what `[train] optimizer` settles to for this model, shown where the run's
    checkpoint recorded no choice (an import)."""
    m = model.cfg
    if positions is not None and not 1 <= positions <= m.context:
        raise MinigptError(
            "{context} {given} is not a length this model reads: it reads 1 to {most} positions ([model] context "
            "= {most}); give a T in that range",
            given=positions,
            most=m.context,
        )
    tc = cfg.train
    choices, step = recorded_choices(run_dir)
    lora = (tc.lora_rank, tc.lora_targets) if tc.lora_rank else None
    if choices is not None:
        optimizer, source = choices["optimizer"], "recorded"
    else:
        optimizer, source = planned_optimizer, "config"
    return Info(
        run=Path(run_dir),
        architecture=model.architecture(),
        parameters=parameter_counts(m, model.vocab_size),
        arithmetic=forward_counts(m, model.vocab_size, positions),
        num_parameters=model.num_parameters(),
        memory=training_memory(m, model.vocab_size, tc.batch_size, optimizer, lora, tc.recompute),
        optimizer=optimizer,
        optimizer_from=source,
        lora=lora,
        adapters=lora_parameter_count(m, *lora) if lora else None,
        batch_size=tc.batch_size,
        choices=choices,
        asked={key: getattr(tc, key) for key in CHOSEN},
        choices_step=step,
        depth_reads=tuple(depth_reads(m)),
    )


def recorded_choices(run_dir: Path) -> tuple[dict[str, Any] | None, int | None]:
    """What the run's last checkpoint recorded that training chose, with the figures `auto`
    measured for it under "measured" where it measured any, and its step (None, None for an import
    or a run trained before minigpt recorded them). Its tensors are not read."""
    payload = load_checkpoint(Path(run_dir) / CHECKPOINT_FILE)
    choices = payload.get("choices")
    if not isinstance(choices, dict):
        return None, None
    measured = payload.get("measured")  # the figures `auto` measured to choose (training/measured.py)
    return ({**choices, "measured": measured} if measured else dict(choices)), payload.get("step")
