"""The KV cache and everything that decides its size.

- ``sizing.py``: bytes per token for a config and a KV format (MHA/GQA/MQA/sliding window, scales included,
  from the kernels' layout table), block budgets, concurrency, and the engine's pool size at start-up.
- ``contiguous.py``: one pre-allocated max-length buffer per sequence (the chapter-2 baseline).
- ``paged.py``: the block pool tensors the kernels read and write, in any KV format.
- ``paged_batch.py``, ``paged_attention.py``: one flat batch over the paged cache (decodes first, slots, block
  tables) and the attention backend that reads and writes it; the engine's runner and the draft proposer share
  both.
- ``block_pool.py``, ``block_manager.py``, ``prefix_cache.py``, ``block_invariants.py``: block tables,
  reference counts, copy-on-write, hashing of full blocks for prefix reuse, LRU eviction, and the leak checks.
- ``calibration.py``: static fp8 scales per layer and KV head, from held-in text.
- ``memory_compare.py``: reserved vs used bytes, contiguous vs paged, for a list of request lengths.
"""
