"""The KV cache: the keys and values every block has computed so far, so that while a text still
fits the position table each sampling step feeds the model only the new token. Buffers are sized to
the table once and written in place (no concatenation per token); a model read past its trained
length on purpose (--extrapolate) grows them, doubling, as the text grows.
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
        if end > self.keys.shape[2]:  # read past the trained length (--extrapolate): twice the room, once
            grown = (*self.keys.shape[:2], max(end, 2 * self.keys.shape[2]), self.keys.shape[3])
            self.keys = _grown(self.keys, grown, self.length)
            self.values = _grown(self.values, grown, self.length)
        self.keys[:, :, self.length : end] = k
        self.values[:, :, self.length : end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]


def _grown(buffer: Tensor, shape: tuple, length: int) -> Tensor:
    bigger = buffer.new_empty(shape)
    bigger[:, :, :length] = buffer[:, :, :length]
    return bigger


class KVCache:
    """One LayerCache per block; `length` is how many positions the model has already seen."""

    def __init__(self, n_layer: int, capacity: int):
        self.layers = [LayerCache(capacity) for _ in range(n_layer)]

    @property
    def length(self) -> int:
        return self.layers[0].length
