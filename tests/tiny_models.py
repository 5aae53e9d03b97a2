"""The one factory for the small random-weight models the tests run: SmolLM2-135M's architecture with some of its
shape changed, deterministic weights, on the CPU. (A helper beside the tests, importable from any test folder.)

Every shape keeps SmolLM2's attention unless a test changes it (9 query heads over 3 KV heads, head_dim 64: the
GQA ratio the kernels and the engine must get right); the usual change is fewer layers, a small vocabulary and a
narrow MLP (``SMALL``), which keeps a forward in milliseconds. Weights never carry meaning here: outputs are
compared between two paths over the same weights, never against a fixed text.
"""

from __future__ import annotations

from workbench.models import LlamaModel, model_spec, random_model

SMALL = {"vocab_size": 256, "intermediate_size": 128}  # the vocabulary and MLP most engine tests shrink to


def tiny_model(*, seed: int = 0, std: float = 0.02, **shape: object) -> LlamaModel:
    """SmolLM2-135M's spec with ``shape``'s fields replaced (``num_layers=2, **SMALL``, ...), random weights drawn
    from ``seed`` (normal, ``std``; norm gains near 1), float32 on the CPU."""
    spec = model_spec("smollm2-135m")
    return random_model(spec.replace(**shape) if shape else spec, device="cpu", seed=seed, std=std)
