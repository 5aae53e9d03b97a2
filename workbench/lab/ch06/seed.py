"""Chapter 6's seed claims recomputed (`workbench.lab.kit.seed_claims`; the list is datasets/seed_claims/ch06.csv)."""

from __future__ import annotations

import pandas as pd
import torch

from workbench.cache.sizing import kv_bytes, weight_bytes
from workbench.lab.ch06.ending import A100_TBPS, H100_TBPS
from workbench.lab.ch06.memory import GB, int4_weight_bytes
from workbench.lab.kit import seed_claims as kit
from workbench.lab.kit.feasibility import check
from workbench.models import model_spec

SEED = "llama-3-70b"


def _bits() -> str:
    spec = model_spec(SEED)
    w16, w4 = weight_bytes(spec, torch.float16), int4_weight_bytes(spec, torch.float16)
    w8 = weight_bytes(spec, torch.float16, "int8")
    return (f"{SEED}: int8 linears {w8 / w16:.2f}x the 16-bit bytes (a scale per output channel, embeddings kept in "
            f"16 bits), int4 with group scales {w4 / w16:.3f}x: close to half and a quarter, not exactly")


def _gpus() -> str:
    sixteen = check(SEED, "A100 80GB", dtype=torch.float16)
    four = int4_weight_bytes(model_spec(SEED), torch.float16)
    return (f"fp16 weights: {sixteen.label.split(': ', 1)[1]}; int4 weights ({four / 2**30:.1f} GiB) fit one "
            "80 GiB A100 (holds: 2 against 1)")


def _kv_8k() -> str:
    spec = model_spec(SEED)
    fp16, int8 = kv_bytes(spec, 8192, kv_format="float16"), kv_bytes(spec, 8192, kv_format="int8")
    return (f"fp16 {fp16 / GB:.2f} GB (holds), int8 with its per-token scales {int8 / GB:.3f} GB, fp8 with scales per "
            f"layer {fp16 / 2 / GB:.2f} GB: int8 is not quite 'the same as fp8'")


def _bandwidth() -> str:
    return f"{H100_TBPS} / {A100_TBPS} = {H100_TBPS / A100_TBPS:.2f}x: 'nearly twice' is loose"


def _int8_a100() -> str:
    return ("set aside: needs an A100 (int8 tensor cores); the nearest this chapter measures is int8 against fp32 "
            "weights on this CPU at batch 1 (section 5.3), where the speed-up is also well below what the bytes "
            "allow, for the per-call costs that section explains")


CHECKS = {"bits": _bits, "gpus": _gpus, "kv_8k": _kv_8k, "bandwidth": _bandwidth, "int8_a100": _int8_a100}


def seed_claims() -> pd.DataFrame:
    """Every number and rule of the book's chapter 6, with what this chapter finds for it."""
    return kit.table("ch06", CHECKS)
