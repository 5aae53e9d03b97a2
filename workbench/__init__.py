"""KV Workbench: a small, real LLM inference engine and the notebooks that measure why each of its
optimizations works. Everything except ``workbench.lab`` imports with only torch, triton, transformers,
numpy, pandas and safetensors.
"""

from workbench.config import ModelSpec, SamplingParams
from workbench.models import (
    LlamaModel,
    ModelNotFoundError,
    config_names,
    default_device,
    fetch_model,
    load_model,
    load_reference_model,
    load_tokenizer,
    model_spec,
    random_model,
)

__version__ = "0.1.0"

__all__ = [
    "LlamaModel", "ModelNotFoundError", "ModelSpec", "SamplingParams", "config_names", "default_device",
    "fetch_model", "load_model", "load_reference_model", "load_tokenizer", "model_spec", "random_model",
]
