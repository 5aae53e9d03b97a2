"""Speculative decoding: cheap proposers draft K tokens, the target verifies them all in one forward.

- ``ngram.py``: prompt lookup (continue the longest recent n-gram match in the context);
- ``draft_proposer.py``: a draft model (any causal model on the target's tokenizer, or the trained EAGLE-style
  head in ``draft_head.py``) with its own paged KV cache over the target's block tables;
- ``verify.py``: greedy prefix acceptance and the rejection-sampling rule that keeps the target's distribution;
- ``stats.py``: acceptance per request, step and draft position, beside (1 - a^(K+1)) / (1 - a);
- ``draft_training/``: how the committed draft for SmolLM2-135M is made from the target's own answers (generated
  by the engine, so that package sits above ``workbench.engine``, unlike the rest of this one), and its offline
  acceptance.
"""
