"""Speculative decoding: cheap proposers draft K tokens, the target verifies them all in one forward.

- ``ngram.py``: prompt lookup (continue the longest recent n-gram match in the context);
- ``draft_proposer.py``: a draft model (any causal model on the target's tokenizer, or the trained EAGLE-style
  head in ``draft_head.py``) with its own paged KV cache over the target's block tables;
- ``verify.py``: greedy prefix acceptance and the rejection-sampling rule that keeps the target's distribution;
- ``stats.py``: acceptance per request, step and draft position (per depth and rank for trees), beside
  (1 - a^(K+1)) / (1 - a);
- token trees: ``tree.py`` (the drafted tree, static shapes, expected yield), ``tree_draft.py`` (growing a
  static or dynamic tree from the draft's distributions), ``tree_verify.py`` (greedy walk, recursive rejection
  sampling over siblings), ``tree_compare.py`` (chain against trees at the same verification budget);
- ``draft_training/``: how the committed draft for SmolLM2-135M is made from the target's own answers (generated
  by the engine, so that package sits above ``workbench.engine``, unlike the rest of this one), and its offline
  acceptance.
"""
