"""Attention Residuals (Kimi Team, arXiv 2603.15031): `[model] residual = "attention"`.

The ordinary residual stream is a sum with fixed unit weights: block l reads x_l = v_0 + v_1 + ... +
v_{l-1}, the embedding and every earlier sublayer's output. Attention Residuals replaces the sum by
a softmax over depth. Every attention and every FFN sublayer is a layer; layer l reads

    h_l = sum_i alpha_{i->l} v_i,   alpha_{i->l} = softmax_i(w_l . RMSNorm(v_i))

over v_0 = the embedding (the token row, plus the position row when positions = "learned") and the
earlier layers' outputs v_i, with one learned pseudo-query w_l per layer, initialised to zero (so
training starts from the uniform average). The final norm reads the same mix with a query of its
own. Block AttnRes (`attention_residual_blocks = N`) splits the layers into N equal blocks: inside a
block the outputs are summed, and a layer mixes the embedding, each finished block's sum and the
sum so far of its own block (once it has one). N = the number of layers is the full form.

What the paper leaves open, and what minigpt chose (docs/guide/depth.md says the same):
- The key norm has no gain. The paper writes RMSNorm(k) and counts "one RMSNorm and one
  pseudo-query per layer" without saying whether that norm has a gain; w . (g * k) = (w * g) . k, so
  a gain adds nothing the query cannot compute, though it would train differently. Its epsilon is
  `[model] norm_eps`.
- The final norm reads every source with a query of its own, then the final norm applies.
- v_0 is the token row plus the position row where the model has a table (the paper's has none).
- attention_residual_blocks must divide the number of layers (the paper lets the last block be short).
- Each sublayer keeps its own pre-norm (norm1, norm2): h_l is what the norm reads, as x is in a
  pre-norm block; post-norm has no such place and is refused.
- The first layer reads v_0 alone, so its query never gets a gradient (a softmax over one source
  is 1 whatever the query); it is kept so that every layer has one.

Nothing here looks across positions: the mix at one position reads that position's rows alone, so
a KV cache needs nothing new, and sampling's last block mixes the last row only past attention.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .recorder import Recorder


def key_norm(value: Tensor, eps: float) -> Tensor:
    """RMSNorm without a gain over the last axis: v / sqrt(mean(v^2) + eps)."""
    return value * torch.rsqrt(value.pow(2).mean(-1, keepdim=True) + eps)


class Depth:
    """The values a layer may read, as the pass has made them so far: the embedding, each finished
    block's sum (each with its key, normed once), and the current block's sum so far. Each step
    returns a new Depth, so a block computed again (`[train] recompute`) starts from the same one.

    Besides the values themselves (autograd's), a detached copy of the finished ones and of their
    keys sits in one preallocated [capacity, B, T, C] store, appended to and never rewritten, so a
    layer reads its S sources as a view of the store's first S rows instead of stacking them anew."""

    def __init__(
        self,
        values: tuple[Tensor, ...],
        keys: tuple[Tensor, ...],
        stores: tuple[Tensor, Tensor],
        partial: Tensor | None,
        filled: int,
        per_block: int,
        eps: float,
    ):
        self.values, self.keys, self.stores, self.partial = values, keys, stores, partial
        self.filled, self.per_block, self.eps = filled, per_block, eps

    @classmethod
    def start(cls, embedding: Tensor, per_block: int, eps: float, layers: int) -> Depth:
        """v_0 alone: what the first layer reads (its mix is v_0 itself, whatever its query).
        `layers`: how many outputs follow, so the store holds every finished value to come."""
        capacity = 1 + layers // per_block
        key = key_norm(embedding, eps)
        stores = (embedding.new_empty((capacity, *embedding.shape)), key.new_empty((capacity, *key.shape)))
        stores[0][0], stores[1][0] = embedding.detach(), key.detach()
        return cls((embedding,), (key,), stores, None, 0, per_block, eps)

    def sources(self) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], Tensor, Tensor]:
        """What a layer reads now: the finished values, then the current block's sum if any; their
        keys; and both stacked, detached ([S, B, T, C]: the store's rows, plus the sum so far)."""
        count = len(self.values)
        values, keys = self.stores[0][:count], self.stores[1][:count]
        if self.partial is None:
            return self.values, self.keys, values, keys
        key = key_norm(self.partial, self.eps)
        stacked = torch.cat((values, self.partial.detach().unsqueeze(0))), torch.cat((keys, key.detach().unsqueeze(0)))
        return (*self.values, self.partial), (*self.keys, key), *stacked

    def add(self, output: Tensor) -> Depth:
        """After a layer: its output added to the current block's sum, which becomes a finished
        value (with its key, both copied into the store) once the block holds `per_block` outputs."""
        partial = output if self.partial is None else self.partial + output
        filled = self.filled + 1
        if filled < self.per_block:
            return Depth(self.values, self.keys, self.stores, partial, filled, self.per_block, self.eps)
        key = key_norm(partial, self.eps)
        count = len(self.values)
        self.stores[0][count], self.stores[1][count] = partial.detach(), key.detach()
        return Depth((*self.values, partial), (*self.keys, key), self.stores, None, 0, self.per_block, self.eps)

    def last_row(self) -> Depth:
        """The same values at the last position alone (sampling's last block, past its attention)."""

        def cut(t: Tensor) -> Tensor:
            return t[:, -1:]

        stores = (self.stores[0][:, :, -1:], self.stores[1][:, :, -1:])
        partial = None if self.partial is None else cut(self.partial)
        return Depth(
            tuple(map(cut, self.values)),
            tuple(map(cut, self.keys)),
            stores,
            partial,
            self.filled,
            self.per_block,
            self.eps,
        )


class DepthAttention(nn.Module):
    """One layer's read over depth: its pseudo-query `query` [C] (zeros at first), the softmax over
    the sources' normed keys, and the mix of the sources themselves."""

    def __init__(self, width: int):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(width))

    def forward(self, depth: Depth, recorder: Recorder | None = None, name: str = "") -> Tensor:
        """-> h [B, T, C]. With a recorder, the weights [B, T, S] are recorded under `name` (and may
        be replaced there) before they mix."""
        values, keys, stacked_values, stacked_keys = depth.sources()
        if recorder is None:  # the same sums in a handful of kernels whatever the depth (_Mix)
            return _Mix.apply(self.query, stacked_values, stacked_keys, len(values), *values, *keys)
        # written out, so that the weights can be recorded (and replaced) before they mix
        logits = torch.stack([key @ self.query for key in keys], dim=-1)  # [B, T, S]: w . key_i
        weights = recorder.record(name, torch.softmax(logits, dim=-1))
        read = values[0] * weights[..., 0:1]
        for i in range(1, len(values)):
            read = read + values[i] * weights[..., i : i + 1]
        return read


class _Mix(torch.autograd.Function):
    """h = sum_i softmax_i(w . key_i) value_i, with its backward written out. It computes on the
    sources stacked (detached: Depth's store) and hands the gradients to the sources themselves, so
    no layer keeps a stacked copy of the stream for the backward pass (autograd's own graph of the
    stacked form would keep L^2 / 2 of them at L layers), and it costs a handful of kernels whatever
    the depth (the form written as a loop costs a few per source)."""

    @staticmethod
    def forward(ctx, query: Tensor, values: Tensor, keys: Tensor, count: int, *sources: Tensor) -> Tensor:
        """`values`, `keys`: [S, B, T, C], detached and never rewritten while the graph lives (the
        store's rows); `sources`: the same S values and S keys as autograd knows them."""
        logits = keys @ query.to(keys.dtype)  # [S, B, T]
        # the softmax in float32 at least (under bfloat16 autocast the keys' product is bfloat16)
        weights = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=0)
        weights = weights.to(values.dtype)
        ctx.save_for_backward(query, weights)
        ctx.stacked = values, keys  # not saved_tensors: the store is appended to in place, these rows never
        ctx.dtypes = [source.dtype for source in sources]
        return (values * weights.unsqueeze(-1)).sum(0)  # (einsum takes a slow batched path here)

    @staticmethod
    def backward(ctx, grad: Tensor):
        query, weights = ctx.saved_tensors
        values, keys = ctx.stacked
        grad = grad.to(weights.dtype)
        grad_weights = (values * grad).sum(-1)  # [S, B, T]: d h / d weight_i = value_i
        grad_values = weights.unsqueeze(-1) * grad  # [S, B, T, C]: d h / d value_i = weight_i
        # the softmax's backward: d logit_i = weight_i (d weight_i - sum_j weight_j d weight_j)
        grad_logits = weights * (grad_weights - (weights * grad_weights).sum(0, keepdim=True))
        width = query.shape[0]
        grad_query = (grad_logits.reshape(-1) @ keys.reshape(-1, width)).to(query.dtype)
        grad_keys = grad_logits.unsqueeze(-1) * query.to(grad_logits.dtype)  # [S, B, T, C]
        grads = (*grad_values.unbind(0), *grad_keys.unbind(0))
        return grad_query, None, None, None, *(g.to(dtype) for g, dtype in zip(grads, ctx.dtypes))
