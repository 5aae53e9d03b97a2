"""The serving engine: requests in, tokens out, continuous batching over the paged KV cache.

``llm_engine.LLMEngine`` is the entry point and wires the parts together. Each ``step()`` asks the
``scheduler`` which sequences run (chunked prefill, preemption when blocks run out, forks of n > 1 requests;
``admission_policy`` says who goes first), lets the speculative proposer draft (``workbench.spec``), has the
``model_runner`` run one forward over the flat batch (``workbench.cache.paged_batch`` and ``paged_attention``:
Triton kernels on CUDA, references on the CPU), and hands the result to the ``bookkeeping``, the one place a
forward's results change state: sampling (``workbench.sampling``), verification, appended tokens, stop checks,
freed blocks and the metrics' timelines. ``requests`` validates what comes in and builds what goes out
(``outputs``); ``sequence`` says which part owns each fact about a sequence; the ``detokenizer`` streams text.
The pool's size comes from ``workbench.cache.sizing``.
"""
