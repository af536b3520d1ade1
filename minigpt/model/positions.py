"""Positions that are not a learned table: rotary positions (rope, whole or on a share of each
head) with rope's scaling rules for reading past the trained length, ALiBi's linear biases and T5's
learned relative biases inside attention, and Vaswani et al.'s fixed sinusoidal table added to the
token row.

rope (Su et al. 2021) rotates each query and key row of a head, pair by pair, by an angle that
grows with its position t. The half-split layout Hugging Face's Llama uses: coordinate j pairs
with j + d/2, and pair i turns at inv_freq_i = theta^(-2i/d) radians per position,

    rotated = x cos(t inv_freq) + rotate_half(x) sin(t inv_freq),  rotate_half([x1, x2]) = [-x2, x1]

so q_m . k_n depends on m - n alone: a model with rope has no table to run out of. It has only
ever been trained on the distances its `context` allows, though, which is what `--extrapolate`
crosses on purpose and what a scaling rule stretches:

    linear:F   position interpolation (Chen et al. 2023): every inv_freq / F, positions squeezed
    ntk:F      transformers' "dynamic" NTK rule: theta grows with the length read,
               theta (F L / context - (F - 1))^(d / (d - 2)) for L > context, unchanged up to context
    yarn:F     YaRN (Peng et al. 2023): fast pairs kept, slow pairs interpolated, a ramp between
               (beta_fast 32, beta_slow 1), and cos and sin scaled by 0.1 ln F + 1
    llama3:F   Llama 3.1's rule (an imported model's): low frequencies / F, high kept, a ramp between

The formulas, and the arithmetic (inv_freq and the angles in float32, then cast to the model's
dtype), are those of transformers' `modeling_rope_utils` and Llama rotary embedding, so that a model
carrying those `rope_scaling` keys computes in minigpt what it computes in transformers. A float64
model (an exact teaching run) computes them in float64 instead: its rope is then the formula to
float64's rounding, and q_m . k_n depends on m - n alone to 1e-12, as its other reference checks ask.

ALiBi (Press et al. 2022) adds -slope_h (i - j) to the score of query i reading key j: no position
enters the stream at all, and farther keys are penalised linearly, at a rate per head taken from a
geometric sequence (`alibi_slopes`).

rope_fraction < 1 (GPT-NeoX's rotary_pct; Kazemnejad et al. 2023 rotate a quarter of each head)
rotates the first r = int(d rope_fraction) coordinates of a head as above, with d = r in every
formula (pairs j and j + r/2), and passes the other d - r through unchanged.

T5 (Raffel et al. 2020) adds b[bucket(i - j), h] to the score of query i reading key j: a learned
bias per head and bucket of distance, one table shared by every block. Half the buckets hold one
distance each (0, 1, ..., B/2 - 1); the rest split the distances up to max_distance logarithmically,
and every distance past it shares the last (transformers' T5 `_relative_position_bucket`, causal).

sinusoidal (Vaswani et al. 2017) adds PE[t] to the token row at position t, PE[t, 2i] =
sin(t / 10000^(2i/C)), PE[t, 2i + 1] = cos(t / 10000^(2i/C)): fixed, defined at every t, so a model
can be read past its trained length (--extrapolate) without a row that was never trained.

Tables are computed once per length and device (and rope's once per scaling), never per step.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..rope_scaling import SCALING_KINDS, RopeScaling, parse_rope_scaling, spelled

# the rules as text live in rope_scaling.py (no torch: config.py reads them); named here too, where
# the models and the importers have always found them
__all__ = ["SCALING_KINDS", "RopeScaling", "parse_rope_scaling", "spelled"]
__all__ += ["inverse_frequencies", "Rotary", "Rotation", "ScoreBias", "Alibi", "alibi_slopes", "RelativeBias"]
__all__ += ["Sinusoids"]


def inverse_frequencies(
    head_width: int,
    theta: float,
    scaling: RopeScaling | None,
    context: int,
    length: int,
    dtype: torch.dtype = torch.float32,
):
    """(inv_freq [d/2] in `dtype`, attention_factor): the angle per position of each pair, as
    transformers computes it (in float32) for a sequence of `length` positions of a model trained
    at `context`."""
    d = head_width
    exponents = torch.arange(0, d, 2, dtype=torch.int64).to(dtype) / d
    if scaling is None:
        return 1.0 / (theta**exponents), 1.0
    original = scaling.original_context or context
    factor = scaling.factor
    if scaling.kind == "linear":
        return 1.0 / (theta**exponents) / factor, 1.0
    if scaling.kind == "dynamic":  # transformers reads max_position_embeddings as the trained length
        # past it transformers takes the length as a tensor, so its new base is float32 arithmetic
        read = torch.tensor(length) if length > original and dtype == torch.float32 else max(length, original)
        base = theta * ((factor * read / original) - (factor - 1)) ** (d / (d - 2))
        return 1.0 / (base**exponents), 1.0
    if scaling.kind == "llama3":
        return _llama3(1.0 / (theta**exponents), scaling, original), 1.0
    return _yarn(d, theta, scaling, original, dtype)


def _yarn(d: int, theta: float, s: RopeScaling, original: int, dtype: torch.dtype) -> tuple[Tensor, float]:
    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = s.attention_factor
    if attention_factor is None:
        attention_factor = (
            mscale(s.factor, s.mscale) / mscale(s.factor, s.mscale_all_dim)
            if s.mscale and s.mscale_all_dim
            else mscale(s.factor)
        )

    def dimension(rotations: float) -> float:  # the pair index that turns `rotations` times over `original`
        return (d * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = dimension(s.beta_fast), dimension(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=dtype) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: the pair turns fast enough to keep its frequency (extrapolated)
    turns = theta ** (torch.arange(0, d, 2).to(dtype) / d)
    inv_freq = (1.0 / (s.factor * turns)) * (1 - keep) + (1.0 / turns) * keep
    return inv_freq, float(attention_factor)


def _llama3(inv_freq: Tensor, s: RopeScaling, original: int) -> Tensor:
    low_wavelength = original / s.low_freq_factor
    high_wavelength = original / s.high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > low_wavelength, inv_freq / s.factor, inv_freq)
    smooth = (original / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
    return torch.where(medium, smoothed, scaled)


class Rotary:
    """One rope rule's rotation tables: cos and sin [positions, d] (each pair's angle repeated in both
    halves), computed once per length, device and dtype. Its rule (`scaling`) is fixed when it is
    made: a model makes one Rotary per rule its readings ask for (`MiniGPT.positions_for`), so two
    readings never share tables. `set_scaling` is for a Rotary of one's own (a test's, a reference's)."""

    def __init__(
        self,
        head_width: int,
        theta: float,
        context: int,
        float32_angles: bool = False,
        scaling: RopeScaling | None = None,
        rotated: int | None = None,
    ):
        """`float32_angles`: compute the angles in float32 even for a float64 model, as transformers
        does for every model (an imported model's [model] rope_angles = "float32"). `rotated`: the
        coordinates of a head that turn, the first ones (rope_fraction); default: all of them."""
        self.head_width, self.theta, self.context = rotated or head_width, theta, context
        self.whole_width = head_width  # the rest of a head passes through unrotated
        self.float32_angles = float32_angles
        self.scaling = scaling
        self._tables: dict = {}
        self._views: dict = {}

    def set_scaling(self, scaling: RopeScaling | None) -> None:
        if scaling != self.scaling:
            self.scaling, self._tables = scaling, {}

    @property
    def length_dependent(self) -> bool:
        """Whether a position's rotation depends on how long the text is (the dynamic rule past the
        trained length): keys rotated for a shorter text are then not the keys of a longer one."""
        return self.scaling is not None and self.scaling.kind == "dynamic"

    def tables(self, end: int, device, dtype) -> tuple[Tensor, Tensor]:
        """cos, sin for positions 0 .. end - 1 (or more), in `dtype` on `device`."""
        return self._cached(end, device, dtype)[:2]

    def _cached(self, end: int, device, dtype) -> tuple[Tensor, Tensor, Tensor]:
        """cos, sin, and [-sin | sin]: what `rotate` multiplies the halves-swapped row by."""
        original = (self.scaling.original_context if self.scaling else None) or self.context
        # the dynamic rule depends on the length read past the trained one; every other rule does not
        key = (end if self.length_dependent and end > original else 0, device, dtype)
        found = self._tables.get(key)
        if found is not None and found[0].shape[0] >= end:
            return found
        # the trained length at once (up to 4,096 rows: an imported model's context may be 131,072)
        rows = max(end, min(self.context, 4096)) if key[0] == 0 else end
        if found is not None:
            rows = max(rows, 2 * found[0].shape[0])  # grow geometrically: a text read a token at a time
        elif key[0]:  # the dynamic rule's tables of other lengths are not read again: keep one, not one per length
            self._tables = {k: v for k, v in self._tables.items() if k[0] == 0}
        # transformers' float32 arithmetic; a float64 model's own, exact to its rounding
        exact = torch.float64 if dtype == torch.float64 and not self.float32_angles else torch.float32
        inv_freq, attention_factor = inverse_frequencies(
            self.head_width, self.theta, self.scaling, self.context, end, exact
        )
        angles = torch.arange(rows, dtype=torch.int64).to(exact)[:, None] * inv_freq[None, :]  # [rows, d/2]
        angles = torch.cat((angles, angles), dim=-1)  # [rows, d]: pair (j, j + d/2) shares its angle
        cos, sin = angles.cos() * attention_factor, angles.sin() * attention_factor
        half = self.head_width // 2
        signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        tables = (cos.to(device, dtype), sin.to(device, dtype), signed.to(device, dtype))
        self._tables[key] = tables
        return tables

    def rotate(self, x: Tensor, start: int) -> Tensor:
        """x [B, T, ..., d] (positions on axis 1, any head axes between) rotated by positions
        start .. start + T - 1."""
        if self.head_width < self.whole_width:  # rope_fraction: the first coordinates turn, the rest pass
            turned, passed = x.split((self.head_width, self.whole_width - self.head_width), dim=-1)
            return torch.cat((self._rotate(turned, start), passed), dim=-1)
        return self._rotate(x, start)

    def _rotate(self, x: Tensor, start: int) -> Tensor:
        T = x.shape[1]
        tables = self._cached(start + T, x.device, x.dtype)
        # the rows of these positions, shaped to broadcast: kept per (start, T), since sampling asks
        # for the same window every step (a slice and a view cost as much as a small kernel here)
        key = (start, T, x.dim(), x.device, x.dtype)
        found = self._views.get(key)
        if found is None or found[0] is not tables:
            shape = (T,) + (1,) * (x.dim() - 3) + (x.shape[-1],)
            cos, signed = tables[0][start : start + T].view(shape), tables[2][start : start + T].view(shape)
            if len(self._views) > 256:  # a text read a token at a time: every start once
                self._views = {}
            found = self._views[key] = (tables, cos, signed)
        _, cos, signed = found
        if x.requires_grad:
            return _Rotation.apply(x, cos, signed)
        return _rotated(x, cos, signed)


def _rotated(x: Tensor, cos: Tensor, signed: Tensor) -> Tensor:
    """x cos + rotate_half(x) sin, as x cos + [x2, x1] [-sin | sin]: the same products and sums, so
    the same bits, but a roll instead of a negation and a concatenation (on the strided slice of the
    qkv output several times faster)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed


class _Rotation(torch.autograd.Function):
    """The rotation, whose gradient is the rotation by minus the angle, g cos - [g2, g1] [-sin | sin],
    written as one multiply and one fused multiply-add over the gradient (autograd's own backward
    takes a pass more), keeping nothing of x for the backward pass, only the model's tables."""

    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, signed: Tensor) -> Tensor:
        ctx.save_for_backward(cos, signed)
        return _rotated(x, cos, signed)

    @staticmethod
    def backward(ctx, grad: Tensor):
        cos, signed = ctx.saved_tensors
        return torch.addcmul(grad * cos, grad.roll(grad.shape[-1] // 2, -1), signed, value=-1), None, None


class Rotation:
    """Rotary positions that other code than Rotary computes (a learner's, `minigpt exercise rope`:
    exercises/plug.py), handed the heads as attention has split them: `turn(q, k, v, start)` returns
    q [B, H, T, d], k and v [B, K, T, d] of positions start .. start + T - 1, the queries and keys
    turned. Attention records what it returns as it records Rotary's, and reads on from there."""

    def turn(self, q: Tensor, k: Tensor, v: Tensor, start: int) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError


def alibi_slopes(n_head: int) -> list[float]:
    """Press et al.'s slopes: for n heads a power of two, 2^(-8/n), 2^(-16/n), ..., 2^(-8); otherwise
    those of the power of two just below n, then every other slope of twice that power."""
    below = 2 ** math.floor(math.log2(n_head))
    slopes = [2 ** (-8 * (i + 1) / below) for i in range(below)]
    if below < n_head:
        slopes += [2 ** (-8 * (i + 1) / (2 * below)) for i in range(0, 2 * below, 2)][: n_head - below]
    return slopes


class ScoreBias:
    """A bias on every head's attention scores that carries the causal mask (-inf past the query):
    ALiBi's and T5's. `bias(T, S, past, device, dtype)` is [H, T, S] for queries past .. past + T - 1
    reading keys 0 .. S - 1; attention adds it to the scaled scores."""

    def bias(self, T: int, S: int, past: int, device, dtype) -> Tensor:
        raise NotImplementedError


def distances(rows: Tensor, keys: int) -> Tensor:
    """i - j for each query position i of `rows` and key j of 0 .. keys - 1: [len(rows), keys]."""
    return rows[:, None] - torch.arange(keys, device=rows.device)[None, :]


class Alibi(ScoreBias):
    """One model's ALiBi biases, shared by its blocks: [H, rows, rows] with -slope_h (i - j) where key
    j <= query i and -inf past it (the causal mask inside the bias). Within the trained length the
    table is built once per device and dtype and sliced for each pass; past it (--extrapolate) the
    rows a pass needs are computed for that pass alone, so a long text never leaves a square table
    of its length behind."""

    def __init__(self, n_head: int, context: int):
        self.slopes = alibi_slopes(n_head)
        self.context = context
        self._tables: dict = {}

    def _table(self, rows: Tensor, keys: int, device, dtype) -> Tensor:
        distance = distances(rows, keys)
        slopes = torch.tensor(self.slopes, dtype=torch.float64)[:, None, None]
        return (-slopes * distance).masked_fill(distance < 0, float("-inf")).to(device, dtype)

    def bias(self, T: int, S: int, past: int, device, dtype) -> Tensor:
        """[H, T, S]: the bias of queries past .. past + T - 1 reading keys 0 .. S - 1."""
        if S > self.context:
            return self._table(torch.arange(past, past + T), S, device, dtype)
        key = (device, dtype)
        found = self._tables.get(key)
        if found is None:
            found = self._tables[key] = self._table(torch.arange(self.context), self.context, device, dtype)
        return found[:, past : past + T, :S]


def t5_buckets(distance: Tensor, buckets: int, max_distance: int) -> Tensor:
    """The bucket of each distance i - j >= 0 (a causal model's), as transformers' T5 computes it
    (`_relative_position_bucket`, bidirectional=False): distances below buckets / 2 their own, then
    logarithmic bins up to max_distance (in float32, as T5's), every farther one the last bucket."""
    exact = buckets // 2
    small = distance < exact
    logarithmic = exact + (
        torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact) * (buckets - exact)
    ).to(torch.long)
    return torch.where(small, distance, logarithmic.clamp(max=buckets - 1))


class RelativeBias(ScoreBias):
    """T5's relative biases of one model, shared by its blocks: `table` (the model's
    `relative_bias`, [buckets, H], learned) read at each query and key's bucket of distance. The
    buckets of the trained length are computed once per device; the bias itself each pass, since
    the table trains."""

    def __init__(self, table: nn.Embedding, max_distance: int, context: int):
        self.table, self.max_distance, self.context = table, max_distance, context
        self._buckets: dict = {}

    def _buckets_of(self, rows: Tensor, keys: int) -> tuple[Tensor, Tensor]:
        """Each query and key's bucket, and where the key is later than the query (masked)."""
        distance = distances(rows, keys)
        return t5_buckets(distance.clamp(min=0), self.table.num_embeddings, self.max_distance), distance < 0

    def bias(self, T: int, S: int, past: int, device, dtype) -> Tensor:
        if past + T > self.context or S > self.context:  # past the trained length: this pass's rows alone
            buckets, later = self._buckets_of(torch.arange(past, past + T, device=device), S)
        else:
            found = self._buckets.get(device)
            if found is None:
                whole = torch.arange(self.context, device=device)
                found = self._buckets[device] = self._buckets_of(whole, self.context)
            buckets, later = (part[past : past + T, :S] for part in found)
        values = self.table(buckets).permute(2, 0, 1)  # b[bucket(i - j), h]: [H, T, S]
        return values.masked_fill(later, float("-inf")).to(dtype)


class Sinusoids:
    """Vaswani et al.'s fixed position rows, PE [positions, C], computed in float64 and cast (a
    float64 model's are exact), once per device and dtype within the trained length, per pass past it."""

    def __init__(self, width: int, context: int):
        self.width, self.context = width, context
        self._tables: dict = {}

    def _table(self, start: int, end: int) -> Tensor:
        t = torch.arange(start, end, dtype=torch.float64)[:, None]
        frequencies = 10000.0 ** (-torch.arange(0, self.width, 2, dtype=torch.float64) / self.width)  # [C/2]
        angles = t * frequencies[None, :]
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(1)  # sin, cos interleaved: [T, C]

    def rows(self, start: int, T: int, device, dtype) -> Tensor:
        """PE[start .. start + T - 1]: [T, C]."""
        if start + T > self.context:
            return self._table(start, start + T).to(device, dtype)
        key = (device, dtype)
        found = self._tables.get(key)
        if found is None:
            found = self._tables[key] = self._table(0, self.context).to(device, dtype)
        return found[start : start + T]
