"""Llama-architecture models: the own forward pass, weight loading, and the registry of names."""

from workbench.models.convert import ModelNotFoundError
from workbench.models.llama import LlamaModel
from workbench.models.registry import (
    checkpoint_dir,
    config_names,
    default_device,
    fetch_model,
    load_model,
    load_reference_model,
    load_tokenizer,
    model_spec,
    random_model,
    resolve_device,
)

__all__ = [
    "LlamaModel", "ModelNotFoundError", "checkpoint_dir", "config_names", "default_device", "fetch_model",
    "load_model", "load_reference_model", "load_tokenizer", "model_spec", "random_model",
    "resolve_device",
]
