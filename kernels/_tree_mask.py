"""The tree attention mask of the paged prefill path: checks, and the reference side's visible-key matrix.

Why it exists: speculative decoding with a token tree verifies every drafted node in one forward. The nodes are
flattened into one chunk (parents before children) whose KV lands in consecutive cache slots, but a node may
only see the cached prefix and its own ancestors, not its siblings or cousins that precede it in the chunk. So
the prefill kernels take an optional ``tree_mask`` ``[total_query_tokens, W]`` (bool): query row ``r`` of
sequence ``b`` sees key position ``context_lens[b] - W + j`` only where ``tree_mask[r, j]`` is set. Keys before
``context_lens[b] - W`` are not restricted, and causality always applies on top (a row never sees a key past its
own slot), so a row of an ordinary chunk is all True and a tree's rows hold its ancestor matrix, right-aligned.
The mask only decides visibility; positions (``prefix + depth`` for a tree node) are the rotary embedding's
business, applied before attention.
"""

from __future__ import annotations

import torch

from ._common import check_tensor


def check_tree_mask(tree_mask: torch.Tensor | None, query: torch.Tensor) -> None:
    if tree_mask is None:
        return
    check_tensor("tree_mask", tree_mask, ndim=2, dtypes=(torch.bool,), device=query.device)
    if tree_mask.shape[0] != query.shape[0] or tree_mask.shape[1] < 1:
        raise ValueError(f"tree_mask must be [total_query_tokens, W] = [{query.shape[0]}, W >= 1], got "
                         f"{tuple(tree_mask.shape)}")
    if tree_mask.stride(1) != 1:
        raise ValueError(f"tree_mask must have stride 1 in its last dimension, got strides {tree_mask.stride()}")


def visible_keys(rows: torch.Tensor | None, q_len: int, context_len: int, device: torch.device) -> torch.Tensor:
    """``[q_len, context_len]`` bool: which keys each query row of one sequence sees — causal (query ``i`` sits at
    position ``context_len - q_len + i``), restricted by that sequence's ``tree_mask`` rows (``rows``, or None)
    over the last ``W`` keys."""
    positions = torch.arange(context_len - q_len, context_len, device=device)
    keys = torch.arange(context_len, device=device)
    visible = keys <= positions[:, None]
    if rows is not None:
        width = rows.shape[1]
        first = context_len - width  # the key position of column 0 (may be negative: those columns see nothing)
        lo = max(first, 0)
        visible[:, lo:] &= rows[:, lo - first:]
    return visible
