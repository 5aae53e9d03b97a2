"""One replica: ``workbench serve`` as a child process on its own port, cores and KV pool, and its counters.

A replica is the same server a single-machine chapter talks to; what the fleet adds is only where it runs
(its share of the cores: ``OMP_NUM_THREADS`` and the CPU affinity) and how big its KV pool is
(``--num-blocks``), so that the prefix cache of one replica holds only a few tenants' prompts, as a real
deployment's does under load.

Counters come from the replica's own ``/metrics`` (vLLM's names), read twice and subtracted, so one run's
numbers do not include what an earlier run left in the counters.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import httpx

from workbench.fleet.processes import ChildProcess
from workbench.monitoring.scrape import parse_exposition

# The counters a fleet reads per replica: vLLM's names (token counts for the prefix cache, as vLLM's V1 counts).
COUNTERS = {
    "requests": "vllm:request_success_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generated_tokens": "vllm:generation_tokens_total",
    "prefix_queries": "vllm:prefix_cache_queries_total",
    "prefix_hits": "vllm:prefix_cache_hits_total",
    "preemptions": "vllm:num_preemptions_total",
}


@dataclass(frozen=True, slots=True)
class ReplicaOptions:
    """What every replica of a fleet runs with: the model and dtype, its KV pool (``num_blocks`` blocks of
    ``block_size`` tokens; None: from the memory budget), the batch limit, and any other ``workbench serve``
    option (``extra_args``)."""

    model: str = "smollm2-135m"
    dtype: str = "float32"
    device: str = "cpu"
    num_blocks: int | None = None
    block_size: int = 16
    max_num_seqs: int = 8
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.num_blocks is not None and (not isinstance(self.num_blocks, int) or self.num_blocks < 4):
            raise ValueError(f"num_blocks must be an integer >= 4 or None, got {self.num_blocks!r}")
        if not isinstance(self.max_num_seqs, int) or self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be an integer >= 1, got {self.max_num_seqs!r}")

    def args(self) -> list[str]:
        out = ["--model", self.model, "--dtype", self.dtype, "--device", self.device, "--block-size",
               str(self.block_size), "--max-num-seqs", str(self.max_num_seqs)]
        if self.num_blocks is not None:
            out += ["--num-blocks", str(self.num_blocks)]
        return out + list(self.extra_args)


class Replica:
    """``workbench serve`` on 127.0.0.1:``port`` pinned to ``cpus`` with one thread per core."""

    def __init__(self, index: int, port: int, cpus: list[int], options: ReplicaOptions, *,
                 grace_s: float = 2.0):
        self.index, self.port, self.cpus, self.options = index, port, list(cpus), options
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "workbench.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                   "--shutdown-grace", str(grace_s), "--log-level", "warning", *options.args()]
        threads = str(len(set(self.cpus)))
        self.child = ChildProcess(f"replica {index} ({self.url})", command, cpus=self.cpus,
                                  env={"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})

    @property
    def name(self) -> str:
        return f"replica {self.index}"

    @property
    def alive(self) -> bool:
        return self.child.alive

    def start(self) -> Replica:
        self.child.start()
        return self

    def wait_ready(self, deadline: float) -> None:
        self.child.wait_http(f"{self.url}/health", deadline)

    def counters(self, timeout_s: float = 5.0) -> dict[str, float]:
        """The replica's counters now (COUNTERS' keys), summed over their labels."""
        response = httpx.get(f"{self.url}/metrics", timeout=timeout_s)
        response.raise_for_status()
        totals = dict.fromkeys(COUNTERS, 0.0)
        by_name = {name: key for key, name in COUNTERS.items()}
        for _at, name, _le, _labels, value in parse_exposition(response.text, 0.0):
            if name in by_name:
                totals[by_name[name]] += value
        return totals

    def stop(self, timeout_s: float = 15.0) -> int | None:
        return self.child.stop(timeout_s)

    def crash(self) -> None:
        """SIGKILL, as a machine that dies does: no draining, open connections cut."""
        import signal

        self.child.signal(signal.SIGKILL)
        if self.child.process is not None:
            self.child.process.wait(10)

    def describe(self) -> str:
        o = self.options
        pool = f"{o.num_blocks} KV blocks of {o.block_size}" if o.num_blocks else "KV pool from the memory budget"
        return (f"{self.name}: {self.url}, cores {self.cpus} ({len(set(self.cpus))} thread(s)), {o.model} "
                f"{o.dtype} on {o.device}, {pool}, at most {o.max_num_seqs} running")
