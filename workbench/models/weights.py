"""Translation between Hugging Face checkpoint tensors and the workbench's fused layout.

Hugging Face stores q/k/v and gate/up as separate matrices; `LlamaModel` keeps each group as one matrix so a
layer runs two matrix products fewer. These two functions are exact inverses, which the tests use to run
transformers and the workbench on the very same (random or real) weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file

from workbench.config import ModelSpec
from workbench.models.llama import LlamaModel


def _layout(spec: ModelSpec) -> list[tuple[str, list[str], list[int]]]:
    """For each workbench parameter: the Hugging Face tensors stacked (along dim 0) to form it, and their rows."""
    q, kv, inter = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.intermediate_size
    h = spec.hidden_size
    table = [("embed_tokens.weight", ["model.embed_tokens.weight"], [spec.vocab_size]),
             ("norm", ["model.norm.weight"], [h])]
    if not spec.tie_word_embeddings:
        table.append(("lm_head.weight", ["lm_head.weight"], [spec.vocab_size]))
    for i in range(spec.num_layers):
        ours, hf = f"layers.{i}.", f"model.layers.{i}."
        attn = [hf + f"self_attn.{n}_proj" for n in "qkv"]
        table += [
            (ours + "input_norm", [hf + "input_layernorm.weight"], [h]),
            (ours + "post_attention_norm", [hf + "post_attention_layernorm.weight"], [h]),
            (ours + "qkv_proj.weight", [n + ".weight" for n in attn], [q, kv, kv]),
            (ours + "o_proj.weight", [hf + "self_attn.o_proj.weight"], [h]),
            (ours + "gate_up_proj.weight", [hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"], [inter, inter]),
            (ours + "down_proj.weight", [hf + "mlp.down_proj.weight"], [h]),
        ]
        if spec.qkv_bias:
            table.append((ours + "qkv_proj.bias", [n + ".bias" for n in attn], [q, kv, kv]))
        if spec.o_bias:
            table.append((ours + "o_proj.bias", [hf + "self_attn.o_proj.bias"], [h]))
    return table


def from_hf_state_dict(model: LlamaModel, hf: Mapping[str, torch.Tensor]) -> None:
    """Copy a Hugging Face Llama/Mistral/Qwen2 state dict into ``model`` (in place, casting to its dtype)."""
    table = _layout(model.spec)
    missing = [name for _, names, _ in table for name in names if name not in hf]
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensor(s) for {model.spec.name}, "
                         f"first: {missing[0]}")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for ours, names, _ in table:
            params[ours].copy_(torch.cat([hf[name] for name in names]))
    model.prepare()


def to_hf_state_dict(model: LlamaModel) -> dict[str, torch.Tensor]:
    """The same weights under Hugging Face names (split q/k/v and gate/up), as independent tensors."""
    params = dict(model.named_parameters())
    out = {"lm_head.weight": model.lm_head.weight.detach().clone()}  # tied models share it with the embedding
    for ours, names, rows in _layout(model.spec):
        for name, part in zip(names, params[ours].detach().split(rows), strict=True):
            out[name] = part.clone()
    return out


def load_safetensors_dir(model: LlamaModel, directory: Path) -> None:
    """Load every ``*.safetensors`` shard of a Hugging Face checkpoint directory into ``model``."""
    shards = sorted(directory.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no .safetensors files in {directory}")
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        tensors.update(load_file(str(shard)))
    from_hf_state_dict(model, tensors)
