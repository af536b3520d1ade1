"""The checks of the `gqa` exercise: grouped-query attention (Ainslie et al. 2023), against minigpt's
CausalSelfAttention with n_kv_head key and value heads (minigpt/model/layers.py), on the same
weights.

The probe has four query heads and two key and value heads, each 4 wide (width 16), so that the
two ways of sharing differ: minigpt's, as transformers' repeat_kv and torch.repeat_interleave, gives
query heads 0, 1 kv head 0 and heads 2, 3 kv head 1; torch.repeat (tiling) gives heads 0, 2 kv head
0. A wrong output is explained by the sharing first (common.Fitting), then shown by its effect:
which query heads change when kv head 1's keys do. Under a KV cache the rows fed after the cached
ones must be those of one pass, and the cache must hold the two kv heads themselves, not a copy for
each query head (the memory GQA saves). The rest of attention (the mask, the scale, the softmax) is
the `attention` exercise's, and an output it changes is said as unexplained.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...config import ModelConfig
from ...model.cache import LayerCache
from ...model.layers import CausalSelfAttention
from .attention import calls_check, mixed, no_bias_check, shapes_check, transpose_hint
from .common import (
    Check,
    Fitting,
    Group,
    Probe,
    agrees_check,
    apart,
    close,
    module_checks,
    parameters_check,
    randn,
    shape,
)
from .norms import pair

NAME = "GroupedQueryAttention"
WIDTH, HEADS, KV_HEADS = 16, 4, 2
HEAD_WIDTH, GROUP = WIDTH // HEADS, HEADS // KV_HEADS


def _rows(positions: int = 5, batch: int = 2) -> Tensor:
    return randn(batch, positions, WIDTH, seed=41)


def _reference(bias: bool = True) -> nn.Module:
    cfg = ModelConfig(n_embd=WIDTH, n_head=HEADS, n_kv_head=KV_HEADS, bias=bias, dtype="float64")
    return CausalSelfAttention(cfg).double().eval()


def kv_head_of(query_head: int, share: str) -> int:
    """The kv head a query head reads: minigpt's h // (H / K), or tiled, h % K."""
    return query_head // GROUP if share == "interleave" else query_head % KV_HEADS


def grouped(x: Tensor, theirs: nn.Module, *, share: str) -> Tensor:
    """Grouped-query attention with the sharing a learner may have chosen (the first, right)."""
    B, T, _ = x.shape
    q, k, v = theirs.qkv(x).split((HEADS * HEAD_WIDTH, KV_HEADS * HEAD_WIDTH, KV_HEADS * HEAD_WIDTH), dim=-1)
    q = q.view(B, T, HEADS, HEAD_WIDTH).transpose(1, 2)
    k, v = (t.view(B, T, KV_HEADS, HEAD_WIDTH).transpose(1, 2) for t in (k, v))
    read = [kv_head_of(h, share) for h in range(HEADS)]
    k, v = k[:, read], v[:, read]  # [B, H, T, d]: query head h's key and value head
    return mixed(
        q, k, v, theirs, HEAD_WIDTH, mask="causal", join="transpose", softmax_over="keys", scale="head", out=True
    )


OPTIONS = {"share": ["interleave", "tile"]}


def split_hint(exc: BaseException) -> str | None:
    """qkv split in three equal parts, as multi-head attention's: here the parts are not equal."""
    if isinstance(exc, ValueError) and "unpack" in str(exc):
        return (
            "self.qkv(x) holds the query heads, then the kv heads' keys, then their values: "
            "split((heads * d, kv_heads * d, kv_heads * d), dim=-1), three parts of different widths"
        )
    return transpose_hint(exc)


def gqa(probe: Probe) -> list[Group]:
    probe.hints = split_hint

    def build(*bias: bool) -> nn.Module:
        return probe.build(NAME, WIDTH, HEADS, KV_HEADS, *bias)

    both = pair(build, _reference)
    fitting = Fitting(probe, NAME, "minigpt's grouped-query attention", both, _rows(), grouped, OPTIONS)

    def forward(module: nn.Module, *args):
        with torch.no_grad():
            return probe.forward(NAME, module, *args)

    def share(choices: dict) -> str | None:
        if choices["share"] == "interleave":
            return None
        tiled = [h for h in range(HEADS) if kv_head_of(h, "tile") == 0]
        return (
            f"your {NAME} tiles the kv heads (k.repeat(1, {GROUP}, 1, 1)): query head h reads kv head h % "
            f"{KV_HEADS}, so heads {tiled[0]} and {tiled[1]} share kv head 0; minigpt, as transformers' repeat_kv, "
            f"gives each group of {GROUP} adjacent query heads one, query head h reading kv head h // {GROUP} "
            f"(k.repeat_interleave({GROUP}, dim=1)), and a checkpoint's W_Q rows of heads 0 and 1 are made for "
            "kv head 0"
        )

    def readers() -> str | None:
        """Which query heads change when kv head 1's keys do: 2 and 3, the second group."""
        mine, _ = both()
        seen: list[Tensor] = []
        hook = mine.out.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().clone()))
        try:
            forward(mine, _rows())
            with torch.no_grad():  # kv head 1's W_K rows, and bias, changed
                rows = slice((HEADS + 1) * HEAD_WIDTH, (HEADS + 2) * HEAD_WIDTH)
                mine.qkv.weight[rows] += 1.0
            forward(mine, _rows())
        finally:
            hook.remove()
        if len(seen) != 2:
            return None  # its calls of self.out are said by their own check
        moved = (seen[0] - seen[1]).view(*seen[0].shape[:2], HEADS, HEAD_WIDTH).abs().amax(dim=(0, 1, 3))
        changed = [h for h in range(HEADS) if moved[h] > 1e-9]
        expected = [h for h in range(HEADS) if kv_head_of(h, "interleave") == 1]
        if changed == expected:
            return None
        return (
            f"changing kv head 1's keys changed query heads {changed or 'none'} of your {NAME}; query head h reads "
            f"kv head h // {GROUP}, so it is read by heads {expected} alone"
        )

    def cached() -> str | None:
        """The rows fed after a cache are what the learner's own pass over every row gives them."""
        mine, _ = both()
        x = _rows()
        whole, cache = forward(mine, x), LayerCache(8)
        forward(mine, x[:, :3], cache)
        later = forward(mine, x[:, 3:], cache)
        if not isinstance(later, Tensor) or later.shape != whole[:, 3:].shape:
            return (
                f"fed positions 3, 4 after a KV cache of 0, 1, 2, your {NAME} returned {shape(later)}, not [2, 2, 16]"
            )
        if close(later, whole[:, 3:]):
            return None
        got, want = apart(later[0, -1], whole[0, -1])
        return (
            f"fed positions 3, 4 after a KV cache of 0, 1, 2, your {NAME} gave {got} at position 4; one pass over "
            f"0 .. 4 gives {want}: the new rows are the last T of the S positions, so query i reads the keys up to "
            "S - T + i (a mask torch.ones(T, S).triu(S - T + 1)), all of them from the cache"
        )

    def cache_holds() -> str | None:
        mine, theirs = both()
        x = _rows()
        mine_cache, their_cache = LayerCache(8), LayerCache(8)
        forward(mine, x, mine_cache)
        with torch.no_grad():
            theirs(x, None, their_cache)
        if mine_cache.keys is None:
            return f"your {NAME} leaves the cache empty: store the keys and values with k, v = cache.extend(k, v)"
        held = list(mine_cache.keys.shape)
        if held[1] == HEADS and KV_HEADS != HEADS:
            return (
                f"your {NAME}'s cache holds {HEADS} key heads ({held}): a copy of the kv heads for each query head; "
                f"store the {KV_HEADS} kv heads (cache.extend(k, v) before repeat_interleave), which is the memory "
                f"GQA saves: a cache {GROUP} times smaller"
            )
        stored = (mine_cache.keys[:, :, :5], mine_cache.values[:, :, :5])
        expected = (their_cache.keys[:, :, :5], their_cache.values[:, :, :5])
        for what, got, want in zip(("keys", "values"), stored, expected):
            if not close(got, want):
                return (
                    f"your {NAME}'s cache holds {shape(got)} as its {what}; it holds each position's {what}, "
                    f"{list(want.shape)}: [B, kv heads, positions, d], x W_{what[0].upper()} split into the kv heads"
                )
        return None

    checks = [
        parameters_check(
            build,
            f"{NAME}({WIDTH}, {HEADS}, {KV_HEADS})",
            {
                "qkv.weight": [(HEADS + 2 * KV_HEADS) * HEAD_WIDTH, WIDTH],
                "qkv.bias": [(HEADS + 2 * KV_HEADS) * HEAD_WIDTH],
                "out.weight": [WIDTH, WIDTH],
                "out.bias": [WIDTH],
            },
            "qkv holds W_Q for the query heads, then W_K and W_V for the kv heads; out is W_O",
        ),
        no_bias_check(f"{NAME}({WIDTH}, {HEADS}, {KV_HEADS}, bias=False)", build),
        shapes_check(NAME, build, forward, _rows),
        fitting.check("share", f"{NAME}'s query head h reads kv head h // {GROUP} (repeat_interleave)", share),
        Check(f"{NAME}'s kv head 1 is read by query heads 2 and 3 alone", readers),
        agrees_check(
            probe,
            NAME,
            both,
            _rows(),
            "minigpt's (minigpt/model/layers.py)",
            lambda x, at: f"at position {at[1]} of example {at[0]}",
        ),
        Check(f"{NAME} fed positions 3, 4 after a KV cache gives them what one pass over 0 .. 4 does", cached),
        Check(f"{NAME}'s cache holds the {KV_HEADS} kv heads' keys and values, not a copy per query head", cache_holds),
        calls_check(NAME, build, forward, _rows()),
        *module_checks(probe, NAME, build, both, _rows(), ("qkv.weight", "qkv.bias", "out.weight", "out.bias")),
    ]
    return [Group(NAME, checks)]
