"""Which waiting sequence is admitted next, and which running one is preempted when KV blocks run out.

The scheduler decides *how much* runs in a step; this module decides *who*. Two policies the course names,
both off by default (first come, first served, and preempt the newest):

- ``scheduling_policy="priority"`` (vLLM's ``--scheduling-policy priority``): every request carries an integer
  ``priority``, lower values first. The waiting queue is admitted in (priority, arrival) order, and when blocks
  run out the running sequence with the *largest* priority value (ties: the latest arrival) is preempted
  first, so urgent requests keep their KV while background ones give theirs back.
- ``cache_aware_admission=True``: among waiting sequences of equal priority, the ones with more of their
  prompt already in the prefix cache go first (SGLang's longest-prefix-match idea). Admitting a request while
  its prefix is still cached turns its prefill into a cache hit; waiting longer risks that prefix being
  evicted by other requests' blocks. It can delay a request with no hit behind a stream of hits: a trade of
  fairness for throughput, which is why it is opt-in.

The policy never touches tensors and never allocates: it only orders sequences it is given.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from workbench.cache.block_manager import BlockManager
from workbench.config import SchedulerConfig
from workbench.engine.sequence import Sequence


class AdmissionPolicy:
    """Orders the waiting queue and picks preemption victims according to a ``SchedulerConfig``."""

    def __init__(self, config: SchedulerConfig):
        self.by_priority = config.scheduling_policy == "priority"
        self.cache_aware = config.cache_aware_admission

    @property
    def reorders(self) -> bool:
        """False for plain FCFS: the queue's own order (arrival, preempted ones in front) is the admission order."""
        return self.by_priority or self.cache_aware

    def order_waiting(self, waiting: deque[Sequence], blocks: BlockManager) -> None:
        """Sort ``waiting`` in place into admission order. The sort is stable, so FCFS order (with preempted
        sequences in front) breaks every tie."""
        if not self.reorders:
            return
        cached = {id(s): cached_prefix_blocks(s, blocks) for s in waiting} if self.cache_aware else {}
        ordered = sorted(waiting, key=lambda s: (s.priority if self.by_priority else 0, -cached.get(id(s), 0)))
        waiting.clear()
        waiting.extend(ordered)

    def victim(self, running: Iterable[Sequence], protected: set[int]) -> Sequence:
        """The running sequence to preempt: not in ``protected`` (scheduled this step), newest first under FCFS,
        lowest priority (largest value, then latest arrival) first under the priority policy."""
        candidates = [s for s in running if s.seq_id not in protected]
        if not candidates:
            raise ValueError("no running sequence may be preempted: every one is already scheduled this step")
        if not self.by_priority:
            return candidates[-1]  # running is in admission order: the newest is last
        return max(reversed(candidates), key=lambda s: (s.priority, s.arrival_time))


def cached_prefix_blocks(seq: Sequence, blocks: BlockManager) -> int:
    """Full blocks of the sequence's known tokens found in the prefix cache right now (0 with caching off)."""
    if not blocks.enable_prefix_caching:
        return 0
    tokens = seq.token_ids
    return len(blocks.prefix_cache.lookup(tokens, (len(tokens) - 1) // blocks.block_size))
