"""Measuring what a KV-cache format costs in quality: KL, top-1 agreement, perplexity, long-context recall."""
