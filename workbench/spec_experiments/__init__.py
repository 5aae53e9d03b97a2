"""Measuring speculative decoding against plain decoding on the real engine: the methods and their engines
(`methods`), side-by-side runs of several proposers on the same prompts (`compare`), the cost of a wider
verification forward (`forward_cost`), the statistical check that sampling keeps the target distribution
(`sampling_check`), and a chain against token trees at one verification budget (`tree_compare`). Chapter 7's
notebook and `benchmarks/bench_spec_decode.py` both run these, so the notebook's numbers and RESULTS.md's come
from one piece of code. This package runs the engine, so it sits above `workbench.engine`, outside `workbench.spec`
(which the engine imports)."""
