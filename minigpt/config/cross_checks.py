"""The checks between keys, as a table: each row a condition that refuses a config and the message
that says why, its values read from the same config. Every key is checked on its own where it is
read (keys.py); these rows are what no single key can say (n_embd a multiple of n_head, a task
without a data file). `cross_check` reads the table, in order, and refuses by the first row that
holds; load_config and the sweep's check of each cell both come through it (loading.resolved).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigError, Phrase
from .fields import toml_value
from .sections import Config
from .shipped import DEFAULT_CORPUS
from .train import LORA_TARGETS, length_range, lora_targets


class CrossCheck:
    """One row: a config for which `refuses` holds is refused with `template` after "{where}: ", its
    other fields filled by `values`, each a function of what the row reads (the [model] section,
    or the whole config). Written as a ConfigError is (the template first, its values by name), so
    that tests/test_layers.py holds each row's template to what it holds every refusal's."""

    def __init__(self, template: str, refuses: Callable[[Any], Any], **values: Callable[[Any], Any]):
        self.template, self.refuses, self.values = template, refuses, values

    def refusal(self, read: Any, where: str | Phrase) -> ConfigError:
        return ConfigError("{where}: " + self.template, where=where, **{k: v(read) for k, v in self.values.items()})


def _not_distinct_targets(text: str) -> bool:
    """Whether `[train] lora_targets` fails to name distinct matrices LoRA knows (or names none)."""
    targets = lora_targets(text)
    return not targets or len(set(targets)) < len(targets) or any(name not in LORA_TARGETS for name in targets)


# Rows that read the [model] section alone (a ModelConfig `m`): all a checkpoint's stored section
# can break (model_config_from), and first in the table.
MODEL_CHECKS: tuple[CrossCheck, ...] = (
    CrossCheck(
        "[model] n_embd = {n_embd} is not divisible by n_head = {n_head}; choose n_embd a multiple of n_head "
        "(e.g. {value})",
        lambda m: m.n_embd % m.n_head and not m.head_width,
        n_embd=lambda m: m.n_embd,
        n_head=lambda m: m.n_head,
        value=lambda m: m.n_head * max(1, m.n_embd // m.n_head),
    ),
    CrossCheck(
        '[model] rope_scaling = "{given}" is given with positions = "{positions}"; it scales rotary positions, so '
        'use it with positions = "rope" or leave it empty',
        lambda m: m.rope_scaling and m.positions != "rope",
        given=lambda m: m.rope_scaling,
        positions=lambda m: m.positions,
    ),
    CrossCheck(
        "[model] n_kv_head = {given} does not divide n_head = {n_head}; each key and value head is shared by an "
        "equal group of query heads, so choose n_kv_head a divisor of n_head (e.g. 1 or {n_head})",
        lambda m: m.n_head % m.kv_heads,
        given=lambda m: m.n_kv_head,
        n_head=lambda m: m.n_head,
    ),
    CrossCheck(
        '[model] positions = "rope" with heads of width {value} (head_width, or n_embd / n_head) is refused: rope '
        "rotates a head's coordinates in pairs, so a head's width must be even; choose n_embd and n_head so that "
        "n_embd / n_head is even, or an even head_width",
        lambda m: m.positions == "rope" and m.resolved_head_width % 2,
        value=lambda m: m.resolved_head_width,
    ),
    CrossCheck(
        '[model] rope_fraction = {given} is given with positions = "{positions}"; it is the share of a head '
        'that rope rotates, so use it with positions = "rope" or leave it at 1.0',
        lambda m: m.rope_fraction != 1.0 and m.positions != "rope",
        given=lambda m: m.rope_fraction,
        positions=lambda m: m.positions,
    ),
    CrossCheck(
        "[model] rope_fraction = {given} rotates {value} of each head's {width} coordinates; rope rotates them in "
        "pairs, so choose a rope_fraction that makes int(width x rope_fraction) even and at least 2 (e.g. 0.25 of "
        "a head 8 wide)",
        lambda m: m.positions == "rope" and (m.rotary_width % 2 or m.rotary_width < 2),
        given=lambda m: m.rope_fraction,
        value=lambda m: m.rotary_width,
        width=lambda m: m.resolved_head_width,
    ),
    CrossCheck(
        '[model] positions = "sinusoidal" with n_embd = {value} is refused: its table pairs a sine with a cosine '
        "for each frequency, so the width must be even; choose an even n_embd",
        lambda m: m.positions == "sinusoidal" and m.n_embd % 2,
        value=lambda m: m.n_embd,
    ),
    CrossCheck(
        "[model] t5_max_distance = {value} is not past the buckets that hold one distance each (t5_buckets / 2 = "
        "{exact}); choose a t5_max_distance above {exact} (T5's: 128 for 32 buckets)",
        lambda m: m.positions == "t5" and m.t5_max_distance <= m.t5_buckets // 2,
        value=lambda m: m.t5_max_distance,
        exact=lambda m: m.t5_buckets // 2,
    ),
    CrossCheck(
        '[model] exercise = "{exercise}" with n_kv_head or head_width set is refused: the exercise\'s attention has '
        "one key and value head per query head, each n_embd / n_head wide; leave both at 0 with it",
        lambda m: (m.n_kv_head or m.head_width) and m.exercise in ("attention", "block"),
        exercise=lambda m: m.exercise,
    ),
    CrossCheck(
        '[model] exercise = "{exercise}" with qkv_bias = {qkv} and out_bias = {out} (bias = false) is refused: the '
        "exercise's attention takes one bias switch for W_Q, W_K, W_V and W_O together; set qkv_bias and out_bias "
        "alike with it",
        lambda m: m.exercise in ("attention", "gqa") and m.biased("qkv") != m.biased("out"),
        exercise=lambda m: m.exercise,
        qkv=lambda m: str(m.qkv_bias).lower(),
        out=lambda m: str(m.out_bias).lower(),
    ),
    CrossCheck(
        '[model] exercise = "{exercise}" with positions = "{positions}" is refused: the exercise\'s attention knows '
        'no {positions} positions (they live inside attention); use positions = "learned" or "none" with it',
        lambda m: m.positions in ("rope", "alibi", "t5") and m.exercise in ("attention", "block", "gqa"),
        exercise=lambda m: m.exercise,
        positions=lambda m: m.positions,
    ),
    CrossCheck(
        '[model] residual = "attention" with norm_position = "post" is refused: Attention Residuals mixes the '
        "sublayers' outputs before each sublayer's own norm (pre-norm), and a post-norm block has no such place; "
        'use norm_position = "pre" with it',
        lambda m: m.residual == "attention" and m.norm_position == "post",
    ),
    CrossCheck(
        "[model] attention_residual_blocks = {value} is given with residual = {residual}; it splits Attention "
        'Residuals into blocks, so set residual = "attention" with it, or leave it at 0',
        lambda m: m.attention_residual_blocks and m.residual != "attention",
        value=lambda m: m.attention_residual_blocks,
        residual=lambda m: toml_value(m.residual),
    ),
    CrossCheck(  # m.layers: every attention and every FFN is one layer
        "[model] attention_residual_blocks = {value} does not divide the model's {layers} layers (n_layer = "
        "{n_layer} blocks, each an attention{ffn}); choose a divisor of {layers}, or 0 for one block per layer "
        "(full Attention Residuals)",
        lambda m: m.attention_residual_blocks and m.layers % m.attention_residual_blocks,
        value=lambda m: m.attention_residual_blocks,
        layers=lambda m: m.layers,
        n_layer=lambda m: m.n_layer,
        ffn=lambda m: " and an FFN" if m.ffn_hidden > 0 else "",
    ),
    CrossCheck(
        '[model] norm = "none" with norm_position = "post" is refused: without norms there is nothing to position, '
        'and the model would be the pre-norm one without norms; use norm_position = "pre" with norm = "none"',
        lambda m: m.norm == "none" and m.norm_position == "post",
    ),
)

# Rows that read the whole config `c`: [train] and [tokenizer], and what the user chose.
CONFIG_CHECKS: tuple[CrossCheck, ...] = (
    CrossCheck(
        '[train] task = "{task}" with [tokenizer] kind = "{kind}" is refused: a task is written one character per '
        'token; leave [tokenizer] kind out (a task run uses "char") or set it to "char"',
        lambda c: (
            c.train.task != "none"
            and ("tokenizer", "kind") in c.chosen
            and c.tokenizer.kind not in ("char", "imported")
        ),
        task=lambda c: c.train.task,
        kind=lambda c: c.tokenizer.kind,
    ),
    CrossCheck(
        '[train] task = "{task}" and [train] data = {data} are both given; a task run trains on the examples it '
        "generates and reads no data: give one of them",
        lambda c: c.train.task != "none" and ("train", "data") in c.chosen and c.train.data != str(DEFAULT_CORPUS),
        task=lambda c: c.train.task,
        data=lambda c: toml_value(c.train.data),
    ),
    CrossCheck(
        '[train] task_lengths = {given} is not a range of lengths; write "A-B" with 1 <= A <= B (e.g. "1-8": every '
        'length from 1 to 8), or "" to train at task_length alone',
        lambda c: c.train.task_lengths and length_range(c.train.task_lengths) is None,
        given=lambda c: toml_value(c.train.task_lengths),
    ),
    CrossCheck(
        "[train] task_length = {length} and task_lengths = {given} are both given; give task_lengths for mixed "
        "lengths, or task_length for one",
        lambda c: c.train.task_lengths and c.train.task_length,
        length=lambda c: c.train.task_length,
        given=lambda c: toml_value(c.train.task_lengths),
    ),
    CrossCheck(
        "[train] adaptive_threads = true with threads = {threads} is refused: adaptive_threads times the thread "
        "count and switches it, threads = {threads} fixes it; set threads = 0 with it, or adaptive_threads = false",
        lambda c: c.train.adaptive_threads and c.train.threads,
        threads=lambda c: c.train.threads,
    ),
    CrossCheck(
        "[train] lora_targets = {given} is not a list of distinct matrices; choose from {join}, comma-separated "
        '(e.g. "qkv,out")',
        lambda c: c.train.lora_rank and _not_distinct_targets(c.train.lora_targets),
        given=lambda c: toml_value(c.train.lora_targets),
        join=lambda c: ", ".join(LORA_TARGETS),
    ),
    CrossCheck(
        "[train] lora_rank = {rank} adapts a trained model, and init_from names none: there is nothing to adapt; "
        "give {init_from} RUN (a trained or imported run), or set lora_rank = 0",
        lambda c: c.train.lora_rank and not c.train.init_from,
        rank=lambda c: c.train.lora_rank,
    ),
    CrossCheck(
        '[train] optimizer = "muon" with lora_rank = {rank} is refused: Muon orthogonalises full matrices, and '
        'LoRA trains rank-{rank} factors; use optimizer = "adamw" (or "auto", which takes it)',
        lambda c: c.train.lora_rank and c.train.optimizer == "muon",
        rank=lambda c: c.train.lora_rank,
    ),
    CrossCheck(
        '[tokenizer] vocab_size = {vocab_size} is too small for kind = "bpe"; byte-level BPE needs at least 257 '
        "(256 bytes plus merges)",
        lambda c: c.tokenizer.kind == "bpe" and c.tokenizer.vocab_size < 257,
        vocab_size=lambda c: c.tokenizer.vocab_size,
    ),
    CrossCheck(
        "[train] min_lr = {min_lr} is above learning_rate = {learning_rate}; set min_lr at most learning_rate",
        lambda c: c.train.min_lr > c.train.learning_rate,
        min_lr=lambda c: c.train.min_lr,
        learning_rate=lambda c: c.train.learning_rate,
    ),
    CrossCheck(
        "[train] task_start = {given} is given without a task; it is the text every task prompt starts with, so "
        "set [train] task with it, or leave it empty",
        lambda c: c.train.task_start and c.train.task == "none",
        given=lambda c: toml_value(c.train.task_start),
    ),
)


def cross_check(cfg: Config, where: str | Phrase | None = None) -> None:
    """Refuse `cfg` by the first row it breaks, the [model] rows first; the refusal names `where`
    (by default the config's source)."""
    where = cfg.source if where is None else where
    for rows, read in ((MODEL_CHECKS, cfg.model), (CONFIG_CHECKS, cfg)):
        for row in rows:
            if row.refuses(read):
                raise row.refusal(read, where)
