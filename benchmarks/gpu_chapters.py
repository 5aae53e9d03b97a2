"""Each chapter's measurement on a GPU, written as a dated result file the chapter draws beside the CPU's.

Why it exists: the course is run on a laptop CPU, where several lessons come out the other way round from a
GPU (the ridge point sits at a few FLOP per byte instead of hundreds; recomputing is cheap or dear for different
reasons). A lent GPU comes for minutes, so every chapter's GPU measurement is prepared here and run in one go
(`benchmarks/gpu_session.py`); each writes ``<out>/<date>-<device>/<chapter>.json`` with the device, versions,
date and command inside, and the chapters read the newest such file from ``datasets/gpu_results/``
(`workbench.lab.kit.gpu_results`). Timing uses random weights of the real shapes (speed does not depend on the
values; no quality or acceptance is ever read from them).

    PYTHONPATH=. python benchmarks/gpu_chapters.py --chapter ch04 --out /tmp/gpu_out/gpu_results
    python benchmarks/gpu_chapters.py --chapter all --device cpu --tiny --out /tmp/dry   # the dry run

Measurements (model shape, bf16 on CUDA):
  ch01  one layer's attention vs linear parts by prompt length (Llama-3-8B shape, to 32K tokens)
  ch02  a decode step with the cache vs recomputing the whole context, by context length (8B shape)
  ch04  prefill and decode steps on the roofline, with the device's measured peaks (8B shape)
  ch05  decode throughput and step time by batch size, 1 to 256 sequences, CUDA graphs (8B shape)
  ch06  KV formats at one fixed KV budget: how many sequences fit and their decode throughput (8B shape)
  ch07  what verifying K drafts costs: a graphed forward over B x (K + 1) positions against B x 1 (both shapes)
  ch10  the same greedy request alone and among other traffic: do its logits change; the invariant mode's cost
  ch11  host-device copy bandwidth (pinned, pageable), the engine's host tier against its prefill (both shapes)
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu_engine import TINY, decode_run, replay_ms  # noqa: E402
from gpu_ch11 import ch11  # noqa: E402, F401 - a chapter measurement, found by name in main()

import workbench  # noqa: E402
from workbench.config import CacheConfig, SamplingParams, SchedulerConfig  # noqa: E402
from workbench.engine.llm_engine import LLMEngine  # noqa: E402
from workbench.intmath import ceil_div
from workbench.models.attention import NoCacheAttention  # noqa: E402

CHAPTERS = ("ch01", "ch02", "ch04", "ch05", "ch06", "ch07", "ch10", "ch11")


class Setup:
    """Device, dtype and sizes for one run: the real ones on CUDA, tiny ones for the CPU dry run."""

    def __init__(self, device: str, tiny: bool):
        self.device, self.tiny = torch.device(device), tiny
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32

    def model(self, name: str, **overrides):
        spec = workbench.model_spec(name)
        spec = spec.replace(**{**TINY, **overrides}) if self.tiny else spec.replace(**overrides)
        return workbench.random_model(spec, dtype=self.dtype, device=self.device, seed=0)

    def sizes(self, real: list[int], tiny: list[int]) -> list[int]:
        return tiny if self.tiny else real


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.processor() or 'cpu'})"


def provenance(setup: Setup, chapter: str) -> dict:
    import transformers

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__}
    if setup.device.type == "cuda":
        import triton

        versions.update(triton=triton.__version__, cuda=torch.version.cuda)
    return {"chapter": chapter, "device": device_name(setup.device), "dtype": str(setup.dtype).replace("torch.", ""),
            "date": datetime.date.today().isoformat(), "versions": versions, "tiny": setup.tiny,
            "command": " ".join(["python", "benchmarks/gpu_chapters.py", *_without_out(sys.argv[1:])])}


def _without_out(argv: list[str]) -> list[str]:
    """The command line without ``--out DIR``: where a run wrote its files says nothing about the measurement."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--out":
            skip = True
        elif not arg.startswith("--out="):
            kept.append(arg)
    return kept


def _frame_records(frame) -> list[dict]:
    return json.loads(frame.reset_index().to_json(orient="records"))


# ------------------------------------------------------------------------------------------------- chapters
def ch01(setup: Setup) -> dict:
    from workbench.roofline.layer_cost import time_layer_parts

    model = setup.model("llama-3-8b", num_layers=1)
    lengths = setup.sizes([512, 1024, 2048, 4096, 8192, 16384, 32768], [16, 32, 64])
    frame = time_layer_parts(model, lengths)
    return {"model": "llama-3-8b", "layer_parts": _frame_records(frame)}


def ch02(setup: Setup) -> dict:
    from workbench.roofline import measure_decode_steps, measure_prefill_steps

    model = setup.model("llama-3-8b")
    contexts = setup.sizes([128, 512, 2048, 7936], [16, 32, 64])  # the last below the 8,192-token context
    prefill = measure_prefill_steps(model, [c + 1 for c in contexts])  # recomputing token c + 1 = this prefill
    decode = measure_decode_steps(model, [1], contexts)
    rows = [{"context": c, "cached_step_ms": 1e3 * float(d), "recompute_ms": 1e3 * float(p)}
            for c, d, p in zip(contexts, decode["step_s"], prefill["step_s"], strict=True)]
    return {"model": "llama-3-8b", "batch": 1, "steps": rows}


def ch04(setup: Setup) -> dict:
    import pandas as pd

    from workbench.roofline import measure_decode_steps, measure_peaks, measure_prefill_steps, place_on_roofline

    model = setup.model("llama-3-8b")
    probes = {"buffer_bytes": 16 * 2**20, "matmul_sizes": (128, 256)} if setup.tiny else {}
    peaks = measure_peaks(setup.device, setup.dtype, **probes)
    prefill = measure_prefill_steps(model, setup.sizes([128, 512, 2048, 4096, 8000], [16, 64]))
    decode = measure_decode_steps(model, setup.sizes([1, 8, 64, 256], [1, 4]), [setup.sizes([512], [32])[0]])
    points = place_on_roofline(pd.concat([prefill, decode], ignore_index=True), peaks)
    points["ms"] = points["step_s"] * 1e3
    keep = ["kind", "batch", "context", "new_tokens", "ms", "flops", "bytes", "intensity", "flops_per_s",
            "bytes_per_s", "bound", "share_of_roof"]
    return {"model": "llama-3-8b", "peak_flops_per_s": peaks.flops_per_s, "peak_bytes_per_s": peaks.bytes_per_s,
            "ridge_flop_per_byte": peaks.ridge, "steps": _frame_records(points[keep])}


def ch05(setup: Setup) -> dict:
    model = setup.model("llama-3-8b")
    batches = setup.sizes([1, 2, 4, 8, 16, 32, 64, 128, 256], [1, 2, 4])
    rows = [decode_run(model, b, 128 if not setup.tiny else 16, 64 if not setup.tiny else 8, graphs=True,
                       fused=True) for b in batches]
    keep = ("batch", "ms_per_step", "tokens_per_s", "tokens_per_s_per_seq", "cuda_graphs", "fused_layer_ops")
    return {"model": "llama-3-8b", "prompt_tokens": 128, "max_num_seqs_cap": max(batches),
            "runs": [{k: r[k] for k in keep} for r in rows]}


def ch06(setup: Setup) -> dict:
    """Every format gets the same KV budget; the batch is as many sequences as that budget holds."""
    from workbench.cache.sizing import kv_bytes_per_token

    model = setup.model("llama-3-8b")
    prompt, new = (1024, 128) if not setup.tiny else (32, 8)
    budget = 2 * 2**30 if not setup.tiny else 2**20
    rows = []
    for fmt in ("auto", "fp8_e4m3", "int8", "int4"):
        per_token = kv_bytes_per_token(model.spec, fmt, model.dtype)
        blocks_per_seq = ceil_div(prompt + new + 16, 16)
        num_blocks = int(budget // (per_token * 16))
        batch = max(1, min(256, num_blocks // blocks_per_seq))
        engine = LLMEngine(model, None, cache_config=CacheConfig(num_blocks=num_blocks, block_size=16,
                                                                 enable_prefix_caching=False, kv_cache_dtype=fmt),
                           scheduler_config=SchedulerConfig(max_num_seqs=batch,
                                                            max_num_batched_tokens=max(2048, prompt + 16)))
        rows.append({"kv_cache_dtype": fmt, "bytes_per_token": per_token, "batch_that_fits": batch,
                     **_timed_decode(engine, model, batch, prompt, new)})
        del engine
        if setup.device.type == "cuda":
            torch.cuda.empty_cache()
    return {"model": "llama-3-8b", "kv_budget_bytes": budget, "prompt_tokens": prompt, "new_tokens": new,
            "formats": rows}


def _timed_decode(engine: LLMEngine, model, batch: int, prompt: int, new: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    vocab = model.spec.vocab_size
    # Warm up at the measured batch: CUDA graphs are captured on first use per batch size, and a capture inside the
    # timed loop read as a slower step (chapter 6's first H200 run: fp8 at batch 28 against chapter 5's batch 32).
    engine.generate([torch.randint(0, vocab, (prompt,), generator=gen).tolist() for _ in range(batch)],
                    SamplingParams(max_tokens=4, ignore_eos=True), progress=False, chat=False)
    for _ in range(batch):
        engine.add_request(torch.randint(0, vocab, (prompt,), generator=gen).tolist(),
                           SamplingParams(max_tokens=new, ignore_eos=True), chat=False)
    while any(s.num_output_tokens == 0 for r in engine.requests.values() for s in r.seqs):
        engine.step()
    _sync(model.device)
    start, steps = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    _sync(model.device)
    seconds = time.perf_counter() - start
    return {"decode_steps": steps, "ms_per_step": 1e3 * seconds / max(steps, 1),
            "tokens_per_s": batch * (new - 1) / seconds}


def graphed_forward_ms(model, batch: int, positions: int, replays: int = 50) -> float:
    """Device time of one forward over ``batch`` sequences of ``positions`` tokens (no cached context), logits at
    every position, as a CUDA graph replayed back to back: the device's cost of verifying, without the host's.
    On the CPU (dry run) the plain forward, timed."""
    ids = torch.randint(0, model.spec.vocab_size, (batch * positions,), device=model.device)
    pos = torch.arange(positions, device=model.device).repeat(batch)
    attention = NoCacheAttention([positions] * batch, model.attention_scale)

    def forward():
        return model.compute_logits(model(ids, pos, attention))

    with torch.inference_mode():
        if model.device.type != "cuda":
            start = time.perf_counter()
            forward()
            return 1e3 * (time.perf_counter() - start)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward()
        ms = replay_ms(graph, replays, warmup=1)
        del graph
        return ms


def ch07(setup: Setup) -> dict:
    rows = []
    for name in ("smollm2-135m", "llama-3-8b"):
        model = setup.model(name)
        for batch in setup.sizes([1, 4, 16, 64], [1, 2]):
            one = graphed_forward_ms(model, batch, 1)
            for k in setup.sizes([1, 2, 4, 8, 16], [1, 4]):
                rows.append({"model": name, "batch": batch, "k": k, "plain_ms": one,
                             "verify_ms": graphed_forward_ms(model, batch, k + 1)})
        del model
        if setup.device.type == "cuda":
            torch.cuda.empty_cache()
    for row in rows:
        row["r"] = row["verify_ms"] / row["plain_ms"]
    return {"forward_cost": rows}


def ch10(setup: Setup) -> dict:
    from workbench.quality.determinism import divergence_experiment, mode_cost, summary

    model = setup.model("llama-3-8b", num_layers=8) if not setup.tiny else setup.model("llama-3-8b")
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.spec.vocab_size, (48,), generator=gen).tolist()
    runs, tokens = setup.sizes([12], [3])[0], setup.sizes([32], [6])[0]
    out = {"model": "llama-3-8b", "num_layers": model.spec.num_layers, "max_tokens": tokens, "max_others": 15}
    pool = 2048  # blocks of 16 per engine (on a GPU the default pool takes most of the device)
    for invariant in (False, True):
        report = divergence_experiment(model, None, prompt, runs=runs, max_tokens=tokens, max_others=15,
                                       batch_invariant=invariant, num_blocks=pool)
        out["invariant" if invariant else "default"] = json.loads(json.dumps(summary(report), default=str))
    prompts = [torch.randint(0, model.spec.vocab_size, (48,), generator=gen).tolist() for _ in range(8)]
    cost = mode_cost(model, None, prompts, max_tokens=tokens, repeats=2, num_blocks=pool)
    out["mode_cost"] = _frame_records(cost)
    return out


def device_slug(name: str) -> str:
    words = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-").split("-")
    return "-".join(w for w in words if w not in {"nvidia", "hbm3", "hbm3e", "sxm", "sxm5", "pcie"})[:40] or "gpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapter", default="all", help=f"one of {', '.join(CHAPTERS)}, or all")
    parser.add_argument("--out", default="datasets/gpu_results")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (the CPU dry run)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available: run with --device cpu --tiny for the dry run")
    chapters = CHAPTERS if args.chapter == "all" else tuple(args.chapter.split(","))
    unknown = set(chapters) - set(CHAPTERS)
    if unknown:
        raise SystemExit(f"unknown chapters {sorted(unknown)}; known: {', '.join(CHAPTERS)}")
    setup = Setup(args.device, args.tiny)
    folder = Path(args.out) / f"{datetime.date.today().isoformat()}-{device_slug(device_name(setup.device))}"
    folder.mkdir(parents=True, exist_ok=True)
    for chapter in chapters:
        start = time.perf_counter()
        measurement = globals()[chapter](setup)
        result = {**provenance(setup, chapter), "seconds": round(time.perf_counter() - start, 1),
                  "measurement": measurement}
        path = folder / f"{chapter}.json"
        path.write_text(json.dumps(result, indent=1, default=float))
        print(json.dumps({"chapter": chapter, "file": str(path), "seconds": result["seconds"]}), flush=True)


if __name__ == "__main__":
    main()
