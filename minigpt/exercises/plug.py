"""A learner's module in a real model: the `Parts` MiniGPT builds in place of its own.

    rmsnorm, layernorm   every norm (norm1, norm2, final_norm) is the learner's class, built
                         (width, eps); the block records its output as minigpt's norm's
    ffn, swiglu          each block's FFN is the learner's class, built (width, hidden, bias), its
                         bias the FFN's own ([model] bias, or ffn_bias)
    attention            each block's attention is the learner's class, built (width, heads, bias),
                         its bias attention's own (bias, or qkv_bias and out_bias together); one
                         key and value head per query head, each n_embd / n_head wide (the config
                         refuses n_kv_head and head_width with it)
    block                each block is the learner's Block, built from minigpt's own norms,
                         attention and FFN (so its parameters are named as minigpt's block's)
    gqa                  each block's attention is the learner's GroupedQueryAttention, built
                         (width, heads, kv_heads, bias), handed the layer's KV cache itself
    rope                 minigpt's attention, its heads turned by the learner's apply_rope (a
                         Rotation, positions.py) where minigpt's Rotary would turn them, at the
                         model's rope_theta
    alibi                minigpt's attention, its scores biased by the learner's alibi_bias with
                         the learner's alibi_slopes (a ScoreBias) where minigpt's Alibi would bias them
    attention_residual   every read over depth (depth1, depth2, final_depth) is the learner's
                         DepthAttention, built (width, norm_eps), handed the sources stacked

The learner's module computes; the stages minigpt records inside a part are recorded around it,
through forward hooks on the modules it calls (the checks make sure it calls them): `hidden` where
it enters the FFN's W2 (and `pre_activation` where it leaves W1), each head's values where they
enter W_O, and the attention weights from the Q and K its own `qkv` computed (softmax of the
masked, scaled scores: the chapter's formula, since the learner's module returns its output
alone). A replacement of such a stage (an intervention, a patch) acts there too, so a trace, a
patch or an attribution of the run reads and changes the learner's computation. A learner's
DepthAttention's weights over depth are recorded likewise, from its own query, and refused as a
replacement (its mix computes its own). The KV cache of
sampling is kept for a learner's attention as the inputs it has seen, which it attends over again;
a learner's GroupedQueryAttention keeps its own keys and values in it (its checks make sure they
are the kv heads).

Each class is the learner's own, subclassed only to take minigpt's call (`forward(x, recorder,
cache, last_only)`): its parameters, names and arithmetic are untouched.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import MinigptError
from ..model import stages
from ..model.cache import LayerCache
from ..model.depth import Depth
from ..model.gpt import Parts
from ..model.layers import CausalSelfAttention, FeedForward, _causal_mask, make_norm
from ..model.positions import Rotation, ScoreBias
from ..model.recorder import Recorder
from .learner import LearnerFile, ended_program, ending_fault, exits_raise, shown_here


def parts_of(learner: LearnerFile) -> Parts:
    """The Parts that put `learner`'s module where minigpt builds its own."""
    name, module, path = learner.exercise, learner.module, learner.path
    source = {"name": name, "file": str(learner.path), "sha256": learner.sha256, "source": learner.source}
    if name in ("rmsnorm", "layernorm"):
        norm = _plugged(module.RMSNorm if name == "rmsnorm" else module.LayerNorm, path)
        return Parts(norm=lambda cfg: norm(cfg.n_embd, cfg.norm_eps), source=source)
    if name in ("ffn", "swiglu"):
        cls = _plugged(module.FeedForward if name == "ffn" else module.SwiGLU, path, _ffn_forward)
        # bias: the FFN's own (bias, or ffn_bias), as minigpt's FeedForward takes it
        return Parts(ffn=lambda cfg: cls(cfg.n_embd, cfg.ffn_hidden, cfg.biased("W1")), source=source)
    if name == "attention":
        cls = _plugged(module.CausalSelfAttention, path, _attention_forward)
        return Parts(
            # one bias switch for W_Q, W_K, W_V and W_O: the config refuses qkv_bias and out_bias that differ
            attention=lambda cfg: _with_heads(cls(cfg.n_embd, cfg.n_head, cfg.biased("qkv")), cfg.n_head),
            source=source,
        )
    if name == "gqa":
        grouped = _plugged(module.GroupedQueryAttention, path, _grouped_forward)
        return Parts(
            attention=lambda cfg: _with_heads(
                grouped(cfg.n_embd, cfg.n_head, cfg.kv_heads, cfg.biased("qkv")), cfg.n_head, cfg.kv_heads
            ),
            source=source,
        )
    if name == "rope":
        apply_rope = _guarded(module.apply_rope, path)
        return Parts(rope=lambda cfg: _LearnerRope(apply_rope, cfg.rope_theta), source=source)
    if name == "alibi":
        slopes, bias = _guarded(module.alibi_slopes, path), _guarded(module.alibi_bias, path)
        return Parts(alibi=lambda cfg: _LearnerAlibi(slopes, bias, cfg.n_head), source=source)
    if name == "attention_residual":
        depth = _plugged(module.DepthAttention, path, _depth_forward)
        return Parts(depth=lambda cfg: depth(cfg.n_embd, cfg.norm_eps), source=source)
    cls = _plugged(module.Block, path, _block_forward)
    return Parts(
        block=lambda cfg: cls(make_norm(cfg), CausalSelfAttention(cfg), make_norm(cfg), FeedForward(cfg)), source=source
    )


def _plugged(cls: type, path: Path, forward=None) -> type:
    """The learner's class, taking minigpt's call: `forward` calls the learner's own (`learner_forward`;
    a norm's is called as it is). Its __init__ and forward say an attempt to end the program as the
    file's fault (a LearnerFault), instead of ending it: training and every reading run them here."""
    own = _guarded(cls.forward, path)
    return type(
        cls.__name__,
        (cls,),
        {
            "__init__": _guarded(cls.__init__, path),
            "forward": forward or own,
            "learner_forward": own,
            "__module__": cls.__module__,
        },
    )


def _guarded(function: Callable, path: Path) -> Callable:
    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            with exits_raise():  # its os._exit too: never a silent exit 0 of the whole command
                return function(*args, **kwargs)
        except BaseException as exc:
            if ended_program(exc):
                raise ending_fault(exc, path, shown_here(path), "the model ran it") from None
            raise

    return call


def _with_heads(module: nn.Module, heads: int, kv_heads: int | None = None) -> nn.Module:
    # what the recorded attention weights split Q and K into
    module.minigpt_heads, module.minigpt_kv_heads = heads, kv_heads or heads
    return module


@contextmanager
def _hooks(*pairs):
    """Forward hooks (and pre-hooks) held for one call: (register, hook) pairs."""
    with ExitStack() as stack:
        for register, hook in pairs:
            stack.callback(register(hook).remove)
        yield


# ---------------------------------------------------------------- ffn, swiglu


def _ffn_forward(self, x: Tensor, recorder: Recorder | None = None) -> Tensor:
    if recorder is None:
        return self.learner_forward(x)
    with _hooks(
        (self.W1.register_forward_hook, lambda m, args, out: recorder.modify(stages.PRE_ACTIVATION, out)),
        (self.W2.register_forward_pre_hook, lambda m, args: (recorder.record(stages.HIDDEN, args[0]), *args[1:])),
    ):
        return self.learner_forward(x)


# ---------------------------------------------------------------- attention


def _attention_forward(
    self, x: Tensor, recorder: Recorder | None = None, cache: LayerCache | None = None, last_only: bool = False
) -> Tensor:
    """The learner's attention over every position it may see: with the cache, the inputs seen so
    far and these (kept in the cache as one head of width C, so the cache's length moves as
    minigpt's does), returning the rows of these T positions."""
    T = x.shape[1]
    seen = x
    if cache is not None:
        seen, _ = cache.extend(x.unsqueeze(1), x.unsqueeze(1))
        seen = seen[:, 0]
    if recorder is None:
        out = self.learner_forward(seen)
    else:
        with _hooks(
            (self.qkv.register_forward_hook, lambda m, args, qkv: _record_weights(recorder, *_split(qkv, self))),
            (
                self.out.register_forward_pre_hook,
                lambda m, args: (_heads(recorder, args[0], self.minigpt_heads), *args[1:]),
            ),
        ):
            out = self.learner_forward(seen)
    out = out[:, -T:]
    return out[:, -1:] if last_only else out


def _split(qkv: Tensor, module: nn.Module) -> tuple[Tensor, Tensor]:
    """The learner's own Q [B, H, T, d] and K [B, K, T, d] from what its qkv computed (heads split as
    the checks require: the query heads, then the key heads, then the value heads)."""
    B, T, _ = qkv.shape
    H, K = module.minigpt_heads, module.minigpt_kv_heads
    d = qkv.shape[-1] // (H + 2 * K)
    q, k, _ = qkv.split((H * d, K * d, K * d), dim=-1)
    return q.view(B, T, H, d).transpose(1, 2), k.view(B, T, K, d).transpose(1, 2)


def _record_weights(recorder: Recorder, q: Tensor, k: Tensor, past: int = 0) -> None:
    """softmax(mask(Q K^T / sqrt(d))) of queries at positions past .. over keys from 0, query head h
    reading key head h // (H / K)."""
    T, S = q.shape[2], k.shape[2]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = q @ k.transpose(-2, -1)
    if scores.dtype in (torch.bfloat16, torch.float16):
        scores = scores.float()  # as minigpt's attention: scale, mask and softmax in float32 at least
    scores = scores / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores.masked_fill(~_causal_mask(T, S, past, q.device), float("-inf")), dim=-1)
    recorder.record(stages.ATTENTION_WEIGHTS, weights.to(q.dtype))


def _heads(recorder: Recorder, joined: Tensor, heads: int) -> Tensor:
    """Each head's values where they enter W_O, as minigpt's `heads` stage ([B, H, T, d]): replaced
    if asked (an ablated head, a patch), and joined back."""
    B, T, C = joined.shape
    mixed = recorder.modify(stages.HEADS, joined.view(B, T, heads, C // heads).transpose(1, 2))
    return mixed.transpose(1, 2).reshape(B, T, C)


# ---------------------------------------------------------------- gqa


def _grouped_forward(
    self, x: Tensor, recorder: Recorder | None = None, cache: LayerCache | None = None, last_only: bool = False
) -> Tensor:
    """The learner's grouped-query attention, handed the layer's KV cache, which it extends itself.
    Recorded: the weights from its own Q and the keys of every position it reads (its cache's past
    these rows, its own), where the joined heads enter W_O, and each head there."""
    if recorder is None:
        out = self.learner_forward(x, cache)
    else:
        past = cache.length if cache is not None else 0
        made: dict[str, Tensor] = {}

        def entering_out(joined: Tensor) -> Tensor:
            q, k = _split(made["qkv"], self)
            if cache is not None:  # every key read: the cached ones, then these (the kv heads)
                k = cache.keys[:, :, : cache.length]
            _record_weights(recorder, q, k, past)
            return _heads(recorder, joined, self.minigpt_heads)

        with _hooks(
            (self.qkv.register_forward_hook, lambda m, args, qkv: made.__setitem__("qkv", qkv)),
            (self.out.register_forward_pre_hook, lambda m, args: (entering_out(args[0]), *args[1:])),
        ):
            out = self.learner_forward(x, cache)
    return out[:, -1:] if last_only else out


# ---------------------------------------------------------------- rope, alibi


class _LearnerRope(Rotation):
    """The learner's apply_rope where minigpt's Rotary turns the heads, at the model's rope_theta. In
    a lowered precision (bfloat16 training) it computes on float32 copies, as Rotary computes its
    angles in float32: a position's angle in bfloat16 is off by whole radians past a few hundred."""

    def __init__(self, apply_rope: Callable, theta: float):
        self.apply_rope, self.theta = apply_rope, theta

    def turn(self, q: Tensor, k: Tensor, v: Tensor, start: int) -> tuple[Tensor, Tensor, Tensor]:
        if q.dtype not in (torch.bfloat16, torch.float16):
            return tuple(self.apply_rope(q, k, v, start, self.theta))
        turned = self.apply_rope(q.float(), k.float(), v.float(), start, self.theta)
        return tuple(t.to(q.dtype) for t in turned)


class _LearnerAlibi(ScoreBias):
    """The learner's alibi_bias with the learner's alibi_slopes (asked once, for the model's head count)
    where minigpt's Alibi biases the scores: computed in float64 on the CPU and moved, as minigpt's
    table is, each pass (a pass's queries are always the last T of its S positions)."""

    def __init__(self, slopes: Callable, bias: Callable, n_head: int):
        self.slopes = torch.as_tensor(slopes(n_head), dtype=torch.float64).reshape(-1)
        self.bias_of = bias

    def bias(self, T: int, S: int, past: int, device, dtype) -> Tensor:
        if past != S - T:
            raise ValueError(f"alibi_bias reads the last T of S positions; got past = {past}, T = {T}, S = {S}")
        return self.bias_of(self.slopes, T, S).to(device, dtype)


# ---------------------------------------------------------------- attention_residual


def _depth_forward(self, depth: Depth, recorder: Recorder | None = None, name: str = "") -> Tensor:
    """The learner's DepthAttention, handed the sources a read over depth mixes, stacked [S, B, T, C]
    (autograd's own, so its gradients reach them). Recorded: the weights over depth from its own query
    (softmax of w . RMSNorm(v_i), minigpt's keys), which its mix cannot be handed in their place."""
    values, keys, _, _ = depth.sources()
    if recorder is not None:
        if recorder.prefix + name in recorder.replacements:
            raise MinigptError(
                "this run's reads over depth are a learner's DepthAttention (exercise attention_residual), which "
                "mixes by its own weights: {name} can be read there but not replaced; change the read itself instead",
                name=recorder.prefix + name,
            )
        logits = torch.stack([key @ self.query for key in keys], dim=-1)  # [B, T, S]
        recorder.record(name, torch.softmax(logits, dim=-1))
    return self.learner_forward(torch.stack(values))


# ---------------------------------------------------------------- block


def _block_forward(
    self, x: Tensor, recorder: Recorder | None = None, cache: LayerCache | None = None, last_only: bool = False
) -> Tensor:
    """The learner's Block.forward on minigpt's parts, each part handed the recorder and the cache it
    takes, and each stage recorded where it leaves a part (residual1 where it enters norm2)."""
    if recorder is None and cache is None:
        out = self.learner_forward(x)
        return out[:, -1:] if last_only else out
    if recorder is not None:
        _refuse_inner_replacements(recorder)
    tap = recorder.record if recorder is not None else (lambda name, value: value)
    with ExitStack() as stack:
        for part, given in (
            (self.attention, {"recorder": recorder, "cache": cache}),
            (self.ffn, {"recorder": recorder}),
        ):
            handle = part.register_forward_pre_hook(
                lambda m, args, kwargs, given=given: (args, {**kwargs, **given}), with_kwargs=True
            )
            stack.callback(handle.remove)
        if recorder is not None:
            for register, hook in (
                (self.norm1.register_forward_hook, lambda m, args, out: tap(stages.NORM1, out)),
                (self.attention.register_forward_hook, lambda m, args, out: tap(stages.ATTENTION, out)),
                (self.norm2.register_forward_pre_hook, lambda m, args: (tap(stages.RESIDUAL1, args[0]), *args[1:])),
                (self.norm2.register_forward_hook, lambda m, args, out: tap(stages.NORM2, out)),
                (self.ffn.register_forward_hook, lambda m, args, out: tap(stages.FFN, out)),
            ):
                stack.callback(register(hook).remove)
        out = tap(stages.OUTPUT, self.learner_forward(x))
    return out[:, -1:] if last_only else out


def _refuse_inner_replacements(recorder: Recorder) -> None:
    """A learner's Block adds its own residual1: recorded where it enters norm2, it cannot be replaced
    there without the Block's own sum missing the change, so such an intervention is refused."""
    name = recorder.prefix + stages.RESIDUAL1
    if name in recorder.replacements:
        raise MinigptError(
            "this run's blocks are a learner's Block (exercise block), which computes residual1 inside its own "
            "forward: {name} can be read there but not replaced; change attention or output instead",
            name=name,
        )
