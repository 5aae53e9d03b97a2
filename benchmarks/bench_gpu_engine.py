"""The whole engine on a GPU: decode speed with CUDA graphs and fused layer kernels on and off, beside the
weight-bandwidth roofline, with where a step's time goes.

Why it exists: at batch 1 a decode step must read every weight once, so the fastest possible rate is the
memory bandwidth over the weight bytes. A Llama-3-8B-shaped model in bf16 (random weights: speed does not
depend on their values) shows how close the engine comes to that floor; a SmolLM2-135M-shaped one shows the
opposite regime, where the weights are so few that launching kernels, not reading memory, sets the step time:
CUDA graphs remove the launch cost on the host, the fused layer kernels (`workbench_kernels.rms_norm`,
``rotary``, ``silu_mul``) remove launches from the graph, and groups of decode steps
(``SchedulerConfig.num_scheduler_steps``) spread the host's work between steps over several steps. Each
configuration runs side by side in one process.

For the fastest configuration of each model at batch 1 it also reports the device's own time per step (the
captured graph replayed back to back, no host work between) and a kernel census from the profiler: kernels
per step and the costliest ones. Step minus replay is what the host adds between steps.

GGUF block weights (``--weights q4_1``: 4-bit blocks multiplied by the Triton kernel of
`workbench_kernels.gguf_matmul`, which converts them in registers) run for the models in ``--weights-models`` at
batch 1 in the fastest configuration, beside the same model's bf16 weights and the roofline of their own bytes.

    PYTHONPATH=. python benchmarks/bench_gpu_engine.py [--models llama-3-8b,smollm2-135m] [--batches 1,64]
        [--prompt 128] [--new-tokens 256] [--weights q4_1] [--weights-models smollm2-135m] [--json out.json]
    python benchmarks/bench_gpu_engine.py --device cpu --tiny     # the dry run: same code, tiny shapes

Prints a table and a final JSON line.
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
from workbench.intmath import ceil_div

TINY = dict(num_layers=2, hidden_size=128, intermediate_size=256, num_heads=4, num_kv_heads=2, head_dim=32,
            vocab_size=512)
# (graphs, fused, scheduler steps) per batch size: batch 1 shows each effect, larger batches the best
# configuration against graphs alone and against one step per engine step
VARIANTS = {1: [(False, True, 1), (True, False, 1), (True, True, 1), (True, True, 8)],
            "other": [(True, False, 1), (True, True, 1), (True, True, 8)]}


def copy_bandwidth_GBps() -> float | None:
    """Device-to-device copy of a 2 GiB buffer: bytes read + written per second (a decode step only reads)."""
    if not torch.cuda.is_available():
        return None
    import triton.testing

    src = torch.randn(2**30, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda src=src, dst=dst: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    del src, dst
    torch.cuda.empty_cache()
    return 2 * 2**31 / ms / 1e6


def weight_bytes(model) -> int:
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def _engine(model, batch: int, prompt: int, new_tokens: int, graphs: bool, steps: int = 1) -> LLMEngine:
    blocks_per_seq = ceil_div(prompt + new_tokens + 16, 16)
    return LLMEngine(model, None, cache_config=CacheConfig(num_blocks=batch * blocks_per_seq + 8, block_size=16,
                                                           enable_prefix_caching=False),
                     scheduler_config=SchedulerConfig(max_num_seqs=batch,
                                                      max_num_batched_tokens=max(2048, batch * prompt),
                                                      num_scheduler_steps=steps),
                     cuda_graphs=graphs)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _decoding_engine(model, batch: int, prompt: int, new_tokens: int, graphs: bool, seed: int,
                     steps: int = 1) -> LLMEngine:
    """An engine after a warm-up (kernels compiled, the graph captured) with ``batch`` requests prefilled."""
    engine = _engine(model, batch, prompt, new_tokens, graphs, steps)
    gen = torch.Generator().manual_seed(seed)
    vocab = model.spec.vocab_size
    engine.generate([torch.randint(0, vocab, (prompt,), generator=gen).tolist() for _ in range(batch)],
                    SamplingParams(max_tokens=8, ignore_eos=True), progress=False, chat=False)
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(torch.randint(0, vocab, (prompt,), generator=gen).tolist(), params, chat=False)
    while any(s.num_output_tokens == 0 for r in engine.requests.values() for s in r.seqs):
        engine.step()
    _sync()
    return engine


def decode_run(model, batch: int, prompt: int, new_tokens: int, graphs: bool, fused: bool, seed: int = 0,
               scheduler_steps: int = 1) -> dict:
    """Prefill ``batch`` random prompts, then time the decode steps until every sequence has ``new_tokens``
    (``ms_per_step`` is per token of each sequence: with groups of ``scheduler_steps``, per step of a group)."""
    model.fused_layer_ops = fused
    engine = _decoding_engine(model, batch, prompt, new_tokens, graphs, seed, scheduler_steps)
    done_before = sum(s.num_output_tokens for r in engine.requests.values() for s in r.seqs)
    engine_steps, start = 0, time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        engine_steps += 1
    _sync()
    decode_s = time.perf_counter() - start
    decoded = batch * new_tokens - done_before
    steps = decoded // batch
    graphs_used = engine.runner.graphs.captured_sizes if engine.runner.graphs is not None else []
    row = {"batch": batch, "cuda_graphs": graphs, "fused_layer_ops": fused and model.runs_fused(
        torch.empty(0, device=model.device, dtype=model.dtype)), "scheduler_steps": scheduler_steps,
        "graphs_captured": graphs_used, "decode_steps": steps, "engine_steps": engine_steps,
        "ms_per_step": round(1e3 * decode_s / steps, 3),
        "tokens_per_s": round(decoded / decode_s, 1), "tokens_per_s_per_seq": round(decoded / decode_s / batch, 1)}
    if graphs_used and scheduler_steps == 1:
        row.update(graph_anatomy(engine, graphs_used[0]))
    del engine
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def replay_ms(graph: torch.cuda.CUDAGraph, replays: int, warmup: int = 10) -> float:
    """Device milliseconds per replay of a captured graph, replayed back to back (no host work between)."""
    for _ in range(warmup):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


def graph_anatomy(engine: LLMEngine, size: int, replays: int = 200) -> dict:
    """The captured decode graph alone: device ms per replay (back to back) and a profiler census of its kernels."""
    graph = engine.runner.graphs._graphs[size].graph
    anatomy = {"replay_ms": round(replay_ms(graph, replays), 4)}
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(e.device_time)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:8]
    anatomy["kernels_per_step"] = round(len(kernels) / 5, 1)
    anatomy["kernel_us_per_step"] = round(sum(e.device_time for e in kernels) / 5, 1)
    anatomy["top_kernels"] = [{"name": name[:90], "per_step": len(t) / 5, "us_per_step": round(sum(t) / 5, 1)}
                              for name, t in top]
    return anatomy


def block_weights_run(spec, model_name: str, fmt: str, dtype, device, bandwidth, args) -> dict:
    """One model with its linear layers in GGUF blocks (`workbench.models.gguf_linear`), batch 1, graphs and fused
    layer kernels on: its decode speed beside the roofline of its own weight bytes."""
    model = workbench.random_model(spec, dtype=dtype, device=device, seed=0, weights=fmt)
    nbytes = weight_bytes(model)
    floor = bandwidth * 1e9 / nbytes if bandwidth else None
    row = decode_run(model, 1, args.prompt, args.new_tokens, graphs=device.type == "cuda", fused=True)
    print(f"{model_name:>14} weights {fmt}: {row['ms_per_step']:8.3f} ms/step, {row['tokens_per_s']:9.1f} tok/s "
          f"({nbytes / 1e6:.0f} MB of weights)", flush=True)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"model": model_name, "weights": fmt, "weight_GB": round(nbytes / 1e9, 3),
            "roofline_tokens_per_s_batch1": None if floor is None else round(floor, 1), "runs": [row]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-3-8b,smollm2-135m")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="shrink every model to 2 small layers (dry run)")
    parser.add_argument("--weights", default="q4_1", help="GGUF weight formats to run at batch 1 ('' for none)")
    parser.add_argument("--weights-models", default="smollm2-135m", help="the models those formats run for")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available: run with --device cpu --tiny for the dry run")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    bandwidth = copy_bandwidth_GBps() if device.type == "cuda" else None
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result = {"benchmark": "gpu_engine", "device": name, "torch": torch.__version__, "dtype": str(dtype),
              "copy_GBps": None if bandwidth is None else round(bandwidth, 1), "prompt": args.prompt,
              "new_tokens": args.new_tokens, "tiny": args.tiny, "models": []}
    print(f"{name}, torch {torch.__version__}: copy {bandwidth or 0:.0f} GB/s (read + written)", flush=True)
    for model_name in args.models.split(","):
        spec = workbench.model_spec(model_name)
        spec = spec.replace(**TINY) if args.tiny else spec
        model = workbench.random_model(spec, dtype=dtype, device=device, seed=0)
        nbytes = weight_bytes(model)
        floor = bandwidth * 1e9 / nbytes if bandwidth else None  # steps/s if a step only read the weights
        entry = {"model": model_name, "weight_GB": round(nbytes / 1e9, 3),
                 "roofline_tokens_per_s_batch1": None if floor is None else round(floor, 1), "runs": []}
        for batch in map(int, args.batches.split(",")):
            for graphs, fused, steps in VARIANTS.get(batch, VARIANTS["other"]):
                row = decode_run(model, batch, args.prompt, args.new_tokens, graphs, fused, scheduler_steps=steps)
                entry["runs"].append(row)
                extra = (f", replay {row['replay_ms']:.3f} ms, {row['kernels_per_step']:.0f} kernels/step"
                         if "replay_ms" in row else "")
                print(f"{model_name:>14} batch {batch:>3} graphs {'on ' if graphs else 'off'} fused "
                      f"{'on ' if row['fused_layer_ops'] else 'off'} steps {steps}: {row['ms_per_step']:8.3f} ms/step, "
                      f"{row['tokens_per_s']:9.1f} tok/s{extra}", flush=True)
        result["models"].append(entry)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if model_name in args.weights_models.split(","):
            for fmt in filter(None, args.weights.split(",")):
                result["models"].append(block_weights_run(spec, model_name, fmt, dtype, device, bandwidth, args))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
