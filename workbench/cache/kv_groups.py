"""KV cache groups: how a model whose layers attend differently (full attention, sliding windows) shares one block
pool, the way vLLM's hybrid KV cache manager lays it out.

Layers of one attention type form groups of **equal size**, each group with its own block tables: a full-attention
group keeps every block of a sequence, a sliding-window group frees the blocks that fall out of its window. One
physical block holds one block of tokens for *one group's* layers, so all blocks cost the same bytes and come from
one shared pool, whichever group takes them. The cache tensors are shared accordingly: tensor ``i`` serves layer
``i`` of every group, and a block id picks which group's tokens are in it.

The group size follows vLLM's rule (``vllm/v1/core/kv_cache_utils.py``, uniform page size): the smallest number of
layers of one type, or the largest when it is within 1.25x of the smallest (fewer, fuller groups); each type's
layers are then cut into groups of that size. SmolLM2 with a window on five layers of six: 25 sliding + 5 full
layers make six groups of five; Gemma 3 27B's 52 + 10 make one full group and six sliding ones of ten (the last
with two layers, so its blocks leave eight tensor slots unused, as vLLM's do).
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.config import ModelSpec
from workbench.intmath import ceil_div


@dataclass(frozen=True, slots=True)
class KVGroup:
    """Layers that share block tables: ``window`` None for full attention."""

    window: int | None
    layers: tuple[int, ...]

    @property
    def is_sliding(self) -> bool:
        return self.window is not None


def first_needed_position(window: int | None, next_position: int) -> int:
    """The oldest position a query at ``next_position`` or later can still see (0 without a window)."""
    return 0 if window is None else max(0, next_position - window + 1)


def group_blocks_needed(window: int | None, num_tokens: int, block_size: int, chunk: int) -> int:
    """Blocks one group holds at most while a sequence of ``num_tokens`` tokens is computed ``chunk`` tokens at a
    time: all of them for full attention; for a window, the blocks spanning the window behind a chunk plus the
    chunk (one more where they straddle a block boundary), never more than the sequence's."""
    whole = ceil_div(num_tokens, block_size)
    if window is None:
        return whole
    span = window - 1 + min(chunk, num_tokens)
    return min(whole, ceil_div(span, block_size) + 1)


@dataclass(frozen=True, slots=True)
class KVGroupLayout:
    """The groups of a model, and where each layer's cache lives."""

    groups: tuple[KVGroup, ...]
    num_layers: int

    @classmethod
    def of(cls, spec: ModelSpec) -> KVGroupLayout:
        """vLLM's grouping of ``spec``'s layers by window (see the module docstring)."""
        by_window: dict[int | None, list[int]] = {}
        for layer, window in enumerate(spec.layer_windows):
            by_window.setdefault(window, []).append(layer)
        counts = [len(layers) for layers in by_window.values()]
        size = max(counts) if max(counts) < 1.25 * min(counts) else min(counts)
        groups = [KVGroup(window, tuple(layers[i:i + size])) for window, layers in by_window.items()
                  for i in range(0, len(layers), size)]
        return cls(tuple(groups), spec.num_layers)

    @property
    def tensors_per_block(self) -> int:
        """Cache tensors (per K and per V): the largest group's layer count."""
        return max(len(g.layers) for g in self.groups)

    @property
    def group_of_layer(self) -> tuple[int, ...]:
        owner = [0] * self.num_layers
        for index, group in enumerate(self.groups):
            for layer in group.layers:
                owner[layer] = index
        return tuple(owner)

    @property
    def tensor_of_layer(self) -> tuple[int, ...]:
        """Which of the shared cache tensors holds each layer: its index inside its group."""
        slot = [0] * self.num_layers
        for group in self.groups:
            for index, layer in enumerate(group.layers):
                slot[layer] = index
        return tuple(slot)

    @property
    def has_windows(self) -> bool:
        return any(g.is_sliding for g in self.groups)

    def blocks_needed(self, num_tokens: int, block_size: int, chunk: int) -> int:
        """Blocks of the shared pool a sequence of ``num_tokens`` tokens holds at most, all groups together."""
        return sum(group_blocks_needed(g.window, num_tokens, block_size, chunk) for g in self.groups)

    def saving(self, num_tokens: int, block_size: int) -> float:
        """Blocks a sequence of ``num_tokens`` holds at its end over what full attention in every layer would
        hold (1.0: nothing saved)."""
        full = len(self.groups) * ceil_div(num_tokens, block_size)
        return self.blocks_needed(num_tokens, block_size, 1) / full if full else 1.0


def grouped(spec: ModelSpec) -> bool:
    """Whether the engine runs ``spec`` with per-group block tables: it names per-layer ``layer_types`` (a config
    without them keeps the plain path, which serves it up to its window: ``ModelSpec.max_context``)."""
    return spec.layer_types is not None

