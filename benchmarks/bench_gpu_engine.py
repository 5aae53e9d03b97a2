"""The whole engine on a GPU: decode speed with and without CUDA graphs, against the weight-bandwidth roofline.

Why it exists: at batch 1 a decode step must read every weight once, so the fastest possible rate is the
memory bandwidth over the weight bytes. A Llama-3-8B-shaped model in bf16 (random weights: speed does not
depend on their values) shows how close the engine comes to that floor; a SmolLM2-135M-shaped one shows the
opposite regime, where the weights are so few that launching kernels, not reading memory, sets the step time,
which is what CUDA graphs remove. Each configuration runs graphs off and on side by side in one process.

    PYTHONPATH=. python benchmarks/bench_gpu_engine.py [--models llama-3-8b,smollm2-135m] [--batches 1,64]
        [--prompt 128] [--new-tokens 256] [--json out.json]

CUDA only (it says so and exits elsewhere).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import workbench
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine


def copy_bandwidth_GBps() -> float:
    """Device-to-device copy of a 2 GiB buffer: bytes read + written per second (a decode step only reads)."""
    import triton.testing

    src = torch.randn(2**30, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda src=src, dst=dst: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    torch.cuda.empty_cache()
    return 2 * 2**31 / ms / 1e6


def weight_bytes(model) -> int:
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def _engine(model, batch: int, prompt: int, new_tokens: int, graphs: bool) -> LLMEngine:
    blocks_per_seq = -(-(prompt + new_tokens + 16) // 16)
    return LLMEngine(model, None, cache_config=CacheConfig(num_blocks=batch * blocks_per_seq + 8, block_size=16,
                                                           enable_prefix_caching=False),
                     scheduler_config=SchedulerConfig(max_num_seqs=batch,
                                                      max_num_batched_tokens=max(2048, batch * prompt)),
                     cuda_graphs=graphs)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def decode_run(model, batch: int, prompt: int, new_tokens: int, graphs: bool, seed: int = 0) -> dict:
    """Prefill ``batch`` random prompts, then time the decode steps until every sequence has ``new_tokens``."""
    engine = _engine(model, batch, prompt, new_tokens, graphs)
    gen = torch.Generator().manual_seed(seed)
    vocab = model.spec.vocab_size
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    # Warm-up: compiles the kernels and captures the graph of this batch size.
    engine.generate([torch.randint(0, vocab, (prompt,), generator=gen).tolist() for _ in range(batch)],
                    SamplingParams(max_tokens=8, ignore_eos=True), progress=False, chat=False)
    for _ in range(batch):
        engine.add_request(torch.randint(0, vocab, (prompt,), generator=gen).tolist(), params, chat=False)
    start = time.perf_counter()
    steps = 0
    while any(s.num_output_tokens == 0 for r in engine.requests.values() for s in r.seqs):
        engine.step()
    _sync()
    prefill_s = time.perf_counter() - start
    decode_start = time.perf_counter()
    done_before = sum(s.num_output_tokens for r in engine.requests.values() for s in r.seqs)
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    _sync()
    decode_s = time.perf_counter() - decode_start
    decoded = batch * new_tokens - done_before
    graphs_used = engine.runner.graphs.captured_sizes if engine.runner.graphs is not None else []
    del engine
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"batch": batch, "cuda_graphs": graphs, "graphs_captured": graphs_used, "prefill_s": round(prefill_s, 4),
            "decode_steps": steps, "ms_per_step": round(1e3 * decode_s / steps, 3),
            "tokens_per_s": round(decoded / decode_s, 1), "tokens_per_s_per_seq": round(decoded / decode_s / batch, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-3-8b,smollm2-135m")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("CUDA is not available: this benchmark measures the engine on a GPU only.")
        return
    bandwidth = copy_bandwidth_GBps()
    result = {"benchmark": "gpu_engine", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "copy_GBps": round(bandwidth, 1), "prompt": args.prompt, "new_tokens": args.new_tokens, "models": []}
    print(f"{result['device']}, torch {torch.__version__}: copy {bandwidth:.0f} GB/s (read + written)")
    for name in args.models.split(","):
        model = workbench.random_model(name, dtype=torch.bfloat16, device="cuda", seed=0)
        nbytes = weight_bytes(model)
        floor = bandwidth * 1e9 / nbytes  # steps per second if a step only read the weights, at copy speed
        entry = {"model": name, "weight_GB": round(nbytes / 1e9, 3), "roofline_tokens_per_s_batch1": round(floor, 1),
                 "runs": []}
        for batch in map(int, args.batches.split(",")):
            for graphs in (False, True):
                row = decode_run(model, batch, args.prompt, args.new_tokens, graphs)
                entry["runs"].append(row)
                print(f"{name:>14} batch {batch:>3} graphs {'on ' if graphs else 'off'}: {row['ms_per_step']:8.3f} "
                      f"ms/step, {row['tokens_per_s']:9.1f} tok/s ({row['tokens_per_s_per_seq']:.1f} per sequence)"
                      f"; roofline at batch 1: {floor:.0f} tok/s", flush=True)
            off, on = entry["runs"][-2], entry["runs"][-1]
            print(f"{'':>14} graphs speed-up {off['ms_per_step'] / on['ms_per_step']:.2f}x", flush=True)
        result["models"].append(entry)
        del model
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
