"""A cache that survives a restart, shown through the server: one server on a disk tier answers a long prompt, stops;
a new server on the same directory answers the same prompt from disk (``usage.prompt_tokens_details.cached_tokens``)
in a fraction of the time; a server of another KV format on the same directory finds none of those files usable.

The servers run in this process (`workbench.serve.launch.ServerThread`), each over a new engine: what a restarted
``workbench serve --kv-offload disk --kv-offload-dir DIR`` finds is exactly what the new engine finds, since the
tier keeps nothing but its files. tests/serve/test_kv_offload_serve.py restarts the real server process.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pandas as pd

from workbench.cache.tier.config import KVOffloadConfig
from workbench.cache.tier.keys import block_digests
from workbench.config import CacheConfig, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.serve.launch import ServerThread

MODEL_NAME = "smollm2-135m"


@dataclass
class RestartRun:
    frame: pd.DataFrame  # server, cached_tokens, ttft_ms
    files: int  # block files on disk after the first server stopped
    usage: dict  # the restarted server's usage block, as a client reads it
    foreign_found: int  # blocks a server of another KV format found usable in the same directory
    folders: list[str]  # one folder per fingerprint

    @property
    def speedup(self) -> float:
        cold, warm = self.frame["ttft_ms"].iloc[0], self.frame["ttft_ms"].iloc[1]
        return float(cold / warm)


def _engine(model, tokenizer, directory: Path, blocks: int, kv_format: str = "auto") -> LLMEngine:
    return LLMEngine(model, tokenizer, cache_config=CacheConfig(block_size=16, num_blocks=blocks,
                                                                kv_cache_dtype=kv_format),
                     scheduler_config=SchedulerConfig(max_num_batched_tokens=2048),
                     kv_offload=KVOffloadConfig("disk", size_gib=1.0, directory=directory))


def _ask(engine: LLMEngine, prompt: list[int]) -> tuple[float, dict]:
    with ServerThread(engine, model_name=MODEL_NAME) as server:
        start = time.perf_counter()
        response = httpx.post(f"{server.url}/v1/completions", timeout=600,
                              json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1, "temperature": 0})
        elapsed = time.perf_counter() - start
    response.raise_for_status()
    return elapsed, response.json()["usage"]


def restart_run(model, tokenizer, directory: Path, *, prompt_tokens: int = 512, seed: int = 3) -> RestartRun:
    rng = random.Random(seed)
    prompt = [rng.randrange(100, model.spec.vocab_size) for _ in range(prompt_tokens)]
    blocks = prompt_tokens // 16 + 8
    rows = []
    for server in ("first server", "restarted server"):
        elapsed, usage = _ask(_engine(model, tokenizer, directory, blocks), prompt)
        rows.append({"server": server, "prompt_tokens": usage["prompt_tokens"],
                     "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"], "ttft_ms": elapsed * 1e3})
        if server == "first server":
            files = len(list(Path(directory).rglob("*.kvb")))
    other = _engine(model, tokenizer, directory, blocks, kv_format="int8")
    names = block_digests(other.kv_offload.root, prompt, 16, (len(prompt) - 1) // 16)
    found = other.kv_offload.store.probe(names)
    folders = sorted(p.name for p in Path(directory).iterdir() if p.is_dir())
    return RestartRun(pd.DataFrame(rows), files, usage, found, folders)
