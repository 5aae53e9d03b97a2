"""Contiguous vs paged KV memory on a real mix of request lengths.

A contiguous cache must reserve, for every sequence slot, room for the longest sequence it could ever hold
(the model's context, or a configured ``max_len``), because it cannot grow a buffer in place. A paged cache
holds only whole blocks of what each sequence has actually produced, wasting at most one partly filled block
per sequence. These functions put the two side by side, per request and as a total, in bytes:

* ``compare_reservations`` computes it from the requests' final lengths (no model needed);
* ``measured_timeline`` reads a real engine run (its step records) and prices what a contiguous cache with
  the same running sequences would have reserved at every step.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from workbench.cache.sizing import blocks_for_tokens


def compare_reservations(lengths: Iterable[tuple[int, int]], *, bytes_per_token: int, max_len: int,
                         block_size: int = 16) -> pd.DataFrame:
    """One row per request (prompt tokens, output tokens): bytes used, and reserved by each cache.

    ``max_len`` is what the contiguous cache reserves per sequence. The frame's ``attrs["totals"]`` holds the
    sums and the saving of paging (1 - paged / contiguous)."""
    if max_len < 1 or block_size < 1 or bytes_per_token < 1:
        raise ValueError(f"max_len, block_size and bytes_per_token must be >= 1, got {max_len}, {block_size}, "
                         f"{bytes_per_token}")
    rows = []
    for prompt, output in lengths:
        tokens = prompt + output
        if tokens > max_len:
            raise ValueError(f"a request of {tokens} tokens does not fit a contiguous cache of max_len {max_len}")
        rows.append({"prompt_tokens": prompt, "output_tokens": output, "tokens": tokens,
                     "used_bytes": tokens * bytes_per_token,
                     "paged_bytes": blocks_for_tokens(tokens, block_size) * block_size * bytes_per_token,
                     "contiguous_bytes": max_len * bytes_per_token})
    frame = pd.DataFrame(rows)
    used, paged, contiguous = (int(frame[c].sum()) for c in ("used_bytes", "paged_bytes", "contiguous_bytes"))
    frame.attrs["totals"] = {"used_bytes": used, "paged_bytes": paged, "contiguous_bytes": contiguous,
                             "paged_waste": 1 - used / paged, "contiguous_waste": 1 - used / contiguous,
                             "saving": 1 - paged / contiguous}
    return frame


def measured_timeline(steps: pd.DataFrame, *, bytes_per_block: int, block_size: int,
                      max_len: int) -> pd.DataFrame:
    """Per engine step: KV bytes the paged cache held vs a contiguous cache holding the same sequences.

    ``steps`` is an engine step frame (`MetricsRecorder.step_frame`); the contiguous cache reserves ``max_len``
    tokens for each sequence in the running batch."""
    per_token = bytes_per_block // block_size
    frame = pd.DataFrame({
        "step": steps["step"],
        "time_s": steps["start_time"] - steps["start_time"].iloc[0],
        "running_seqs": steps["batch_size"],
        "paged_bytes": steps["kv_blocks_used"] * bytes_per_block,
        "contiguous_bytes": steps["batch_size"] * max_len * per_token,
    })
    frame["saving"] = 1 - frame["paged_bytes"] / frame["contiguous_bytes"].where(frame["contiguous_bytes"] > 0)
    return frame
