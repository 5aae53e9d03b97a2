"""Speculative decoding: cheap proposers draft K tokens, the target verifies them all in one forward.

- ``ngram.py``: prompt lookup (continue the longest recent n-gram match in the context);
- ``draft_proposer.py``: a draft model (any causal model on the target's tokenizer, or the trained EAGLE-style
  head in ``draft_head.py``) with its own paged KV cache over the target's block tables;
- ``verify.py``: greedy prefix acceptance and the rejection-sampling rule that keeps the target's distribution;
- ``stats.py``: acceptance per request, step and draft position (per depth and rank for trees), beside
  (1 - a^(K+1)) / (1 - a);
- token trees: ``tree.py`` (the drafted tree, static shapes, expected yield), ``tree_draft.py`` (growing a
  static or dynamic tree from the draft's distributions), ``tree_verify.py`` (greedy walk, recursive rejection
  sampling over siblings);
- ``drafts.py``: what a step verifies for one sequence (a chain with its distributions, or a tree).

The engine imports this package, so nothing here imports the engine. What runs the engine to study speculation
sits above it, in packages of its own: ``workbench.spec_experiments`` (methods side by side, the verification
forward's cost, the sampling check, chain against trees at one verification budget) and
``workbench.draft_training`` (how the committed draft for SmolLM2-135M is made from the target's own answers,
and its offline acceptance).
"""
