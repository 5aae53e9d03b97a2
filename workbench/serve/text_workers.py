"""Tokenizing and detokenizing request bodies off the engine thread.

The engine thread must never wait on a request's text: a 4 MB prompt takes about 2 s to tokenize, and while
the engine thread did it (as it once did) every running stream stopped. So request text goes through a small pool
of threads here instead, and the engine thread only receives token ids. The Hugging Face fast tokenizer releases
the GIL while it encodes (measured: a 4 MB encode left a 5 ms ticker thread at most 30 ms late), so the engine
thread keeps stepping meanwhile.

Each worker has its own copy of the tokenizer, made here before any thread starts: a fast tokenizer shared across
threads can fail with "Already borrowed" (the engine thread's detokenizers use the original between steps).
"""

from __future__ import annotations

import asyncio
import copy
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

# Enough that one huge body does not hold up every other request's tokenization, few enough not to crowd the
# cores the engine computes on.
DEFAULT_TEXT_WORKERS = max(2, min(4, (os.cpu_count() or 2) // 2))


class TextWorkers:
    """``await workers.run(fn)`` runs ``fn(tokenizer)`` on a pool thread with that thread's own tokenizer."""

    def __init__(self, tokenizer: Any, num_workers: int = DEFAULT_TEXT_WORKERS):
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}")
        self._copies: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(num_workers):
            self._copies.put(copy.deepcopy(tokenizer))
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="text-worker")

    def _tokenizer(self) -> Any:
        own = getattr(self._local, "tokenizer", None)
        if own is None:  # this pool thread's first task: take one of the copies for good
            own = self._local.tokenizer = self._copies.get_nowait()
        return own

    async def run(self, fn: Callable[[Any], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(self._tokenizer()))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
