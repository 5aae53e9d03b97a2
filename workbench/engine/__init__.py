"""The serving engine: requests in, tokens out, continuous batching over the paged KV cache.

``llm_engine.LLMEngine`` is the entry point. Each ``step()`` asks the ``scheduler`` which sequences run
(chunked prefill, preemption when blocks run out), the ``model_runner`` packs them into one flat batch and runs
the model through ``workbench.cache.paged_attention`` (Triton kernels on CUDA, references on the CPU),
``workbench.sampling`` picks tokens, the ``detokenizer`` streams text, and speculative decoding (``workbench.spec``)
drafts and verifies when enabled. ``cache_setup`` sizes the block pool from a memory budget;
``memory_probe`` measures what the device really holds.
"""
