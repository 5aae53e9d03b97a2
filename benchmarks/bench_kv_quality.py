"""KV-cache formats side by side on the real model: memory, KL, top-1 agreement, perplexity, recall.

Also the two measurements behind the format decisions: how unequal the KV heads are (fp8 scales per head) and
int4 keys grouped per token vs per channel (KIVI). Greedy first-token agreement of int8 on short chat prompts
is reported as a fraction.

    .venv/bin/python benchmarks/bench_kv_quality.py [--recall-per-length 8]
"""

from __future__ import annotations

import argparse
import json

import torch

import workbench
from workbench.cache.calibration import calibration_ids, head_amax_spread
from workbench.config import CacheConfig, SamplingParams
from workbench.data import load_prompts
from workbench.engine.llm_engine import LLMEngine
from workbench.paths import DATASETS_DIR
from workbench.quality.key_grouping import key_grouping_study
from workbench.quality.report import kv_quality_report


def first_tokens_agreement(model, tokenizer, kv_format: str, prompts: list[str], n: int = 8) -> float:
    """Fraction of prompts whose first ``n`` greedy tokens match the unquantized cache's."""
    outs = {}
    for fmt in ("auto", kv_format):
        engine = LLMEngine(model, tokenizer, cache_config=CacheConfig(kv_cache_dtype=fmt))
        outs[fmt] = [o.token_ids[:n] for o in engine.generate(prompts, SamplingParams(max_tokens=n), progress=False)]
    return sum(a == b for a, b in zip(outs["auto"], outs[kv_format], strict=True)) / len(prompts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recall-per-length", type=int, default=8)
    args = parser.parse_args()
    model, tokenizer = workbench.load_model(device="cpu")
    report = kv_quality_report(model, tokenizer, recall_per_length=args.recall_per_length,
                               recall_lengths=(256, 1024, 2048))
    prompts = load_prompts("varied") + load_prompts("draft_heldout")[:24]
    report["first8_greedy_agreement"] = [first_tokens_agreement(model, tokenizer, f, prompts) if f != "auto" else 1.0
                                         for f in report.index]
    with torch.no_grad():
        text_ids = tokenizer((DATASETS_DIR / "eval" / "heldout.txt").read_text())["input_ids"]
        grouping = key_grouping_study(model, text_ids)
    spread = head_amax_spread(model, calibration_ids(model, tokenizer))
    print(report.to_string(float_format=lambda x: f"{x:.4g}"))
    print("int4 key grouping:", {k: {m: round(v, 4) for m, v in r.items() if m != "perplexity_reference"}
                                 for k, r in grouping.items()})
    print("KV head amax spread:", spread)
    print(json.dumps({"benchmark": "kv_quality", "device": "cpu", "model": "SmolLM2-135M-Instruct (dequantized Q4_1)",
                      "prompts_for_first8": len(prompts), "formats": report.reset_index().to_dict(orient="records"),
                      "int4_key_grouping": grouping, "head_amax_spread": spread}, default=float))


if __name__ == "__main__":
    main()
