"""Weight formats x KV-cache formats on the real model, side by side in one run: memory, speed, quality.

Rows: fp32 weights and int8 weights (every decoder linear layer, per-output-channel scales), each with every KV
format; int8 weights with the LM head quantized too; the GGUF file's own Q4_1 blocks and Q8_0 blocks
(`workbench.models.gguf_linear`); and a bfloat16 model (the usual GPU baseline). Columns:
weight bytes, KV bytes per token, KV blocks and max concurrency at 1 GiB, batch-1 decode tokens/s, 32-request
throughput, and quality against fp32 weights + fp32 cache: KL, top-1 agreement and perplexity on the held-out
text, long-context recall. Batch-1 decode fp32 vs each quantized format is also measured in alternating rounds
(int8's goal: >= 1.5x with top-1 agreement >= 0.95). Writes the table to datasets/eval/quant_sweep.json for
chapter 6's notebook.

    .venv/bin/python benchmarks/bench_weight_quant.py [--batch1 | --micro] [--rounds 5]
        [--recall-per-length 2] [--no-write]

Sized for one run on the 2-core CPU: quality uses the whole held-out text (1,364 tokens), long-context recall
2 items per length (1,024 and 2,048 tokens; each item is a 2K-token prefill, so 4 per length would add ~4
minutes), so a recall figure moves in steps of 0.5 (1 of 2 items). Each configuration takes ~75 s (quality
~7 s, recall ~20 s, 32-request throughput ~40 s), the bf16 row ~3 minutes (its batched products are slow on a
CPU without bf16 matrix units): ~15 minutes in all, measured on the shared machine. ``--recall-per-length 0``
drops recall (~3 minutes less).

``--batch1`` runs only the batch-1 comparison (~2 minutes): the alternating decode rounds and, for each int8
format, KL and top-1 agreement against fp32 on the held-out text; it writes nothing.

``--micro`` prints only the linear-layer table behind the CPU kernel choice (fbgemm vs packed fp32 vs
``torch._weight_int8pack_mm`` vs torchao's int8 weight-only path when torchao is importable).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import warnings

import pandas as pd
import torch
import torch.nn.functional as F

import workbench
from workbench.models.cpu_linear import Linear
from workbench.models.int8_linear import Int8Linear
from workbench.quality.format_sweep import (
    decode_tokens_per_s,
    heldout_ids,
    measure_config,
    quality_row,
    save_sweep,
)
from workbench.quality.teacher_forcing import logits_through_cache
from workbench_kernels.kv_quant import KV_FORMATS

SHAPES = {"qkv 960x576": (960, 576), "gate_up 3072x576": (3072, 576), "down 576x1536": (576, 1536),
          "lm_head 49152x576": (49152, 576)}


def _best_us(fn, x: torch.Tensor, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn(x)
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def _candidates(layer: Linear) -> dict:
    int8 = Int8Linear.from_float(layer)
    int8.pack()
    paths = {"packed fp32": layer, "int8 (fbgemm, split rows)": int8,
             "_weight_int8pack_mm": lambda x: torch.ops.aten._weight_int8pack_mm(x, int8.qweight, int8.scale)}
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        plain = torch.nn.Linear(layer.in_features, layer.out_features, bias=False)
        plain.weight = torch.nn.Parameter(layer.weight.detach().clone(), requires_grad=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_(ao := copy.deepcopy(plain), Int8WeightOnlyConfig())
        paths["torchao int8 weight-only"] = ao
    except ImportError:
        pass
    return paths


@torch.inference_mode()
def micro_table(rows: tuple[int, ...] = (1, 8, 32)) -> pd.DataFrame:
    """Best-of-many microseconds per product, every path interleaved in rounds (robust to a loaded machine)."""
    records = []
    for name, (n, k) in SHAPES.items():
        layer = Linear(k, n, bias=False)
        torch.nn.init.normal_(layer.weight, std=0.05)
        layer.pack()
        paths = _candidates(layer)
        for m in rows:
            x = torch.randn(m, k)
            best = {p: float("inf") for p in paths}
            for _ in range(4):
                for p, fn in paths.items():
                    best[p] = min(best[p], _best_us(fn, x, 3 if n > 10_000 else 15))
            err = {p: float((fn(x) - F.linear(x, layer.weight)).abs().max()) for p, fn in paths.items()}
            records += [{"shape": name, "rows": m, "path": p, "us": t, "vs packed fp32": best["packed fp32"] / t,
                         "max abs error": err[p]} for p, t in best.items()]
    return pd.DataFrame(records)


# The quantized weight formats beside fp32: int8 per channel (decoder; + head), the GGUF file's own Q4_1 blocks
# (exact to fp32) and Q8_0 blocks (`workbench.models.gguf_linear`).
QUANTIZED = ("int8", "int8_all", "q4_1", "q8_0")


def alternating_decode(models: dict, tokenizer, rounds: int) -> dict[str, list[float]]:
    """Batch-1 decode tokens/s of each model, in alternating rounds so load drifts hit all alike."""
    runs: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            runs[name].append(decode_tokens_per_s(model, tokenizer, tokens=48))
    return runs


def batch1_summary(models: dict, tokenizer, rounds: int) -> dict:
    """The goal's numbers: batch-1 decode rounds, median int8 / fp32 ratios, and each format's top-1 and KL."""
    decode = alternating_decode({k: models[k] for k in ("fp32", *QUANTIZED)}, tokenizer, rounds)
    summary: dict = {"decode_rounds": decode}
    for name in QUANTIZED:
        summary[f"{name}_over_fp32_median"] = statistics.median(
            b / a for a, b in zip(decode["fp32"], decode[name], strict=True))
    return summary


def batch1_quality(models: dict, tokenizer) -> dict:
    ids = heldout_ids(tokenizer)
    reference = logits_through_cache(models["fp32"], ids, "auto")
    return {name: quality_row(models[name], tokenizer, "auto", reference, ids) for name in QUANTIZED}


def sweep(models: dict, tokenizer, recall_per_length: int) -> pd.DataFrame:
    ids = heldout_ids(tokenizer)
    reference = logits_through_cache(models["fp32"], ids, "auto")
    rows = []
    for name, model in models.items():
        formats = KV_FORMATS if name in ("fp32", "int8") else ("auto",)
        for kv_format in formats:
            rows.append(measure_config(model, tokenizer, kv_format, reference, ids,
                                       recall_per_length=recall_per_length))
            print(f"{name:>9} / {kv_format:<8} " + " ".join(f"{k}={v:.4g}" for k, v in rows[-1].items()
                                                             if isinstance(v, float)), flush=True)
    return pd.DataFrame(rows)


def print_batch1(summary: dict) -> None:
    rounds = summary["decode_rounds"]
    print("batch-1 decode tokens/s, alternating rounds: "
          + "; ".join(f"{k} " + " / ".join(f"{v:.1f}" for v in runs) for k, runs in rounds.items()))
    for name in QUANTIZED:
        line = f"{name} / fp32 median {summary[f'{name}_over_fp32_median']:.2f}x"
        if name in summary.get("quality", {}):
            q = summary["quality"][name]
            line += f", top-1 agreement {q['top1_agreement']:.3f}, KL {q['kl_mean']:.4f}"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro", action="store_true", help="only the linear-layer kernel table")
    parser.add_argument("--batch1", action="store_true", help="only batch-1 decode speed and top-1 (writes nothing)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating batch-1 decode rounds")
    parser.add_argument("--recall-per-length", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="do not update datasets/eval/quant_sweep.json")
    args = parser.parse_args()
    if args.micro:
        table = micro_table()
        print(table.to_string(float_format=lambda v: f"{v:.3g}"))
        print(json.dumps({"benchmark": "weight_quant_micro", "rows": table.to_dict(orient="records")}))
        return
    fp32, tokenizer = workbench.load_model(device="cpu")
    models = {"fp32": fp32, **{name: workbench.load_model(device="cpu", weights=name)[0] for name in QUANTIZED}}
    if args.batch1:
        summary = batch1_summary(models, tokenizer, args.rounds)
        summary["quality"] = batch1_quality(models, tokenizer)
        print_batch1(summary)
        print(json.dumps({"benchmark": "weight_quant_batch1", "device": "cpu", "threads": torch.get_num_threads(),
                          **summary}, default=float))
        return
    models["bf16"] = workbench.load_model(device="cpu", dtype=torch.bfloat16)[0]
    summary = batch1_summary(models, tokenizer, args.rounds)
    table = sweep(models, tokenizer, args.recall_per_length)
    print(table.to_string(float_format=lambda v: f"{v:.4g}"))
    print_batch1(summary)
    if not args.no_write:
        save_sweep(table, summary)
    print(json.dumps({"benchmark": "weight_quant", "device": "cpu", "threads": torch.get_num_threads(), **summary,
                      "rows": table.to_dict(orient="records")}, default=float))


if __name__ == "__main__":
    main()
