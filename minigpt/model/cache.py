"""model.cache: carved from model.py (docstring to write)

MiniGPT: chapter 17's model, in the chapter's order and with the trace's names.

    x = token_table[ids] + position_table[start : start + T]     refuses start + T > context
    for block in blocks (pre-norm, chapter 17.5):
        norm1 = LN1(x);  attention = MHA(norm1);  residual1 = x + attention
        norm2 = LN2(residual1);  hidden = act(norm2 W1 + b1);  ffn = hidden W2 + b2
        output = residual1 + ffn;  x = output
    logits = final_norm(x) W_head

Row vectors throughout: a Linear stores W as [out, in], so `x @ W` in the chapter is `x @ weight.T`.
A `Recorder` passed to `forward` records every named stage of this same pass as it is computed
(the names come from stages.py); there is no second implementation for the trace to drift from, and
none for sampling either: its speed-up is a transformation of the weights (fold.py) that this same
forward runs. Without a recorder attention takes the fused scaled-dot-product kernel; with one it
computes the weights explicitly so they can be shown.

The forward pass has no host synchronisation: token ids are checked where they enter (prompt, trace
ids, corpus: `check_token_ids`), and the only check inside is the context length, a shape.

This forward is also sampling's inner loop: past the position table each new token is one pass of
about sixty small ops (a millisecond at the default shape on one CPU thread), where Python's own
work is a tenth of the time. So inside the model each submodule is applied through its `forward`
and each matrix through `linear` (F.linear on the layer's own weight and bias) rather than through
nn.Module.__call__, whose hook machinery costs about a microsecond a call and thirty-five calls a
pass; hooks on submodules therefore do not fire (the Recorder is how a pass is tapped; hooks on the
model itself still do). Dropout is called only where it acts (in eval mode or at p = 0 it returns
its input and draws nothing), and each submodule is looked up once per pass (a module's attribute
lookup is a Python call).
"""

from __future__ import annotations

from torch import Tensor


class LayerCache:
    """Keys and values one block has computed so far, in buffers sized to the position table."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.keys: Tensor | None = None
        self.values: Tensor | None = None
        self.length = 0

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.keys is None:
            shape = (k.shape[0], k.shape[1], self.capacity, k.shape[3])
            self.keys = k.new_empty(shape)
            self.values = v.new_empty(shape)
        end = self.length + k.shape[2]
        self.keys[:, :, self.length : end] = k
        self.values[:, :, self.length : end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]


class KVCache:
    """One LayerCache per block; `length` is how many positions the model has already seen."""

    def __init__(self, n_layer: int, capacity: int):
        self.layers = [LayerCache(capacity) for _ in range(n_layer)]

    @property
    def length(self) -> int:
        return self.layers[0].length
