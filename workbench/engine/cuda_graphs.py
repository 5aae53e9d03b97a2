"""CUDA graphs for decode steps: capture one forward per batch-size bucket, then replay it.

Why: a decode step of a small model is hundreds of tiny kernel launches (norms, projections, rope, the cache
store, attention, per layer), and on a fast GPU the CPU issuing them is slower than the GPU running them, so
the step costs launch overhead, not memory traffic. A CUDA graph records the launches once and replays them in
one call. Replaying needs every tensor at the address it had when captured, so each bucket owns static input
buffers (ids, positions, slot mapping, a block table of fixed width, context lengths) that a step fills before
replaying, and its outputs (hidden states, tapped layers, logits) live in the graph's memory until the next
replay overwrites them: the runner copies out what it keeps.

Only pure decode batches replay (one token per sequence, no drafts to verify): prefill chunks change shape
every step. A batch of ``n`` sequences runs in the smallest bucket ``>= n``; padding rows write no KV (slot -1)
and attend to one key of block 0, and their outputs are never read. Buckets are captured lazily on first use
(a capture costs a warm-up forward plus the recording) or all at once by ``capture_all``.
"""

from __future__ import annotations

import torch

from workbench.cache.paged import PagedKVCache
from workbench.cache.paged_attention import PagedAttention
from workbench.cache.paged_batch import PagedBatch, PagedBatchMetadata
from workbench.models.llama import LlamaModel


def bucket_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, then every multiple of 8 below ``max_num_seqs``, then ``max_num_seqs`` itself."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    sizes = {1, 2, 4, *range(8, max_num_seqs, 8)}
    return sorted({s for s in sizes if s < max_num_seqs} | {max_num_seqs})


class _Captured:
    """One bucket: its graph and the static tensors the graph reads and writes."""

    def __init__(self, size: int, width: int, device: torch.device):
        self.size = size
        self.input_ids = torch.zeros(size, dtype=torch.int64, device=device)
        self.positions = torch.zeros(size, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((size,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros(size, width, dtype=torch.int32, device=device)
        self.context_lens = torch.ones(size, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(size + 1, dtype=torch.int32, device=device)
        self.graph = torch.cuda.CUDAGraph()
        self.hidden: torch.Tensor | None = None
        self.tapped: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None

    def pad(self) -> None:
        """Every row a harmless padding row: writes nothing, attends to one key."""
        self.slot_mapping.fill_(-1)
        self.context_lens.fill_(1)
        self.block_tables.zero_()
        self.input_ids.zero_()
        self.positions.zero_()

    def metadata(self) -> PagedBatchMetadata:
        return PagedBatchMetadata(slot_mapping=self.slot_mapping, block_tables=self.block_tables,
                                  context_lens=self.context_lens, query_start_loc=self.query_start_loc,
                                  num_decode_seqs=self.size)


class DecodeGraphs:
    """Captured decode forwards of ``model`` over ``cache``, one per bucket of batch sizes up to ``max_num_seqs``.

    ``max_blocks_per_seq`` fixes the block table's width (the decode kernel's split count follows from it)."""

    def __init__(self, model: LlamaModel, cache: PagedKVCache, *, max_num_seqs: int, max_blocks_per_seq: int,
                 taps: tuple[int, ...] = ()):
        if model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA model, this one is on {model.device}")
        self.model, self.cache, self.taps = model, cache, tuple(taps)
        model.rope.reserve(model.spec.max_context)  # positions are read on the device only, once captured
        self.sizes = bucket_sizes(max_num_seqs)
        self.width = max_blocks_per_seq
        self._graphs: dict[int, _Captured] = {}
        self._pool = None  # one memory pool shared by every bucket's graph

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    @property
    def captured_sizes(self) -> list[int]:
        return sorted(self._graphs)

    def bucket_for(self, num_seqs: int) -> int:
        for size in self.sizes:
            if size >= num_seqs:
                return size
        raise ValueError(f"{num_seqs} sequences exceed the largest captured batch ({self.max_batch})")

    def can_run(self, batch: PagedBatch) -> bool:
        meta = batch.metadata
        return (meta.num_decode_seqs == meta.num_seqs <= self.max_batch
                and meta.block_tables.shape[1] <= self.width)

    def _forward(self, captured: _Captured) -> None:
        attention = PagedAttention(self.cache, captured.metadata(), self.model.attention_scale)
        hidden, tapped = self.model.forward_with_taps(captured.input_ids, captured.positions, attention, self.taps)
        captured.hidden, captured.tapped = hidden, tapped
        captured.logits = self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self, size: int) -> None:
        if size in self._graphs:
            return
        captured = _Captured(size, self.width, self.model.device)
        # Warm up outside the graph on a side stream: Triton compiles, cuBLAS picks its kernels and workspace.
        stream = torch.cuda.Stream(self.model.device)
        stream.wait_stream(torch.cuda.current_stream(self.model.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(captured)
        torch.cuda.current_stream(self.model.device).wait_stream(stream)
        with torch.cuda.graph(captured.graph, pool=self._pool):
            self._forward(captured)
        self._pool = captured.graph.pool()
        self._graphs[size] = captured

    def capture_all(self) -> None:
        """Capture every bucket, largest first (smaller graphs then reuse the pool the largest reserved)."""
        for size in sorted(self.sizes, reverse=True):
            self.capture(size)

    @torch.inference_mode()
    def run(self, batch: PagedBatch, input_ids: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Replay the bucket for ``batch`` (a pure decode batch, `can_run`; its tensors on the device or, better,
        in pinned host memory: `build_paged_batch(on_host=True)`); returns views of the first ``num_seqs`` rows of
        hidden, tapped and logits, valid until the next replay. ``input_ids``: the tokens to feed, already on the
        device (a multi-step decode's previous step), instead of the batch's."""
        meta = batch.metadata
        n = meta.num_seqs
        size = self.bucket_for(n)
        self.capture(size)
        captured = self._graphs[size]
        if n < size:
            captured.pad()
        # From pinned host memory (or the device) without waiting: a decode step's only wait is for its tokens.
        captured.input_ids[:n].copy_(batch.input_ids if input_ids is None else input_ids, non_blocking=True)
        captured.positions[:n].copy_(batch.positions, non_blocking=True)
        captured.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        captured.context_lens[:n].copy_(meta.context_lens, non_blocking=True)
        captured.block_tables[:n, : meta.block_tables.shape[1]].copy_(meta.block_tables, non_blocking=True)
        captured.graph.replay()
        tapped = None if captured.tapped is None else captured.tapped[:n]
        return captured.hidden[:n], tapped, captured.logits[:n]
