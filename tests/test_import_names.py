"""The kernels folder must not shadow Hugging Face's `kernels` package, which transformers probes by name."""

from __future__ import annotations

import os
import subprocess
import sys

from workbench.paths import REPO_ROOT

PROBE = """
import importlib.util, json
import workbench_kernels
from transformers.utils import import_utils
spec = importlib.util.find_spec("kernels")
print(json.dumps({"kernels_found": spec is not None and spec.origin == "%s",
                  "hub_kernels_available": import_utils.is_kernels_available()}))
""" % (REPO_ROOT / "kernels" / "__init__.py")


def _probe(*flags: str, env_extra: dict[str, str] | None = None) -> dict:
    import json

    env = {**os.environ, **(env_extra or {})}
    out = subprocess.run([sys.executable, *flags, "-c", PROBE], cwd=REPO_ROOT, env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_installed_kernels_are_not_importable_as_kernels():
    # -P: no working directory on sys.path, as for the pytest and jupyter entry points and the CLI.
    result = _probe("-P")
    assert result == {"kernels_found": False, "hub_kernels_available": False}


def test_running_from_the_tree_does_not_fake_the_hub_package():
    # `python -c`/`python -m` from the repository root, and GPU machines running the tests from the tree with
    # PYTHONPATH=. (no install), put the folder on sys.path: transformers may find it by the name `kernels`
    # but must not mistake it for the hub package.
    for result in (_probe(), _probe("-P", env_extra={"PYTHONPATH": str(REPO_ROOT)})):
        assert result == {"kernels_found": True, "hub_kernels_available": False}


def test_transformers_loads_llama_with_the_tree_on_the_path():
    code = ("from transformers import LlamaConfig, LlamaForCausalLM; "
            "LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, "
            "num_attention_heads=2, vocab_size=50)); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("ok")
