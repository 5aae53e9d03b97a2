"""Sliding-window attention for the paged kernels: the argument's check and its encoding for the Triton kernels.

Why it exists: a sliding-window layer (Mistral, Gemma 3's local layers, gpt-oss's banded layers) lets the query at
position ``p`` see only keys ``p - window + 1 .. p``, the ``window`` most recent ones, itself included (the
convention of transformers' sliding-window masks and of gpt-oss's reference ``sdpa``). The decode and prefill
kernels take ``window`` (None: no limit) and never read a key outside it, so a block table whose entries before
the window were freed (`workbench.cache.hybrid_block_manager`) is never read there either.
"""

from __future__ import annotations

# What the Triton kernels receive for "no window": larger than any context, so p - window + 1 <= 0 always.
NO_WINDOW = 1 << 30


def check_window(window: int | None) -> int:
    """The window as the kernels take it (``NO_WINDOW`` for None); ValueError for anything but None or >= 1."""
    if window is None:
        return NO_WINDOW
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window < NO_WINDOW:
        raise ValueError(f"window must be None or an integer in [1, {NO_WINDOW}), got {window!r}")
    return window
