"""The router in front of the replicas: vllm-router, the vLLM project's router (a Rust binary shipped in a PyPI
wheel, ``pip install vllm-router``), not one written here.

It speaks the OpenAI API to clients and forwards each request to one worker, chosen by a policy:

- ``round_robin``: the next worker in turn, whatever the request;
- ``cache_aware``: the worker whose radix tree of earlier request texts shares the longest prefix with this
  request, when that match covers at least ``--cache-threshold`` (0.3) of it; otherwise the worker with the
  smallest tree. Load evens out only when the busiest worker runs more than ``--balance-abs-threshold`` (64)
  requests over the idlest *and* more than ``--balance-rel-threshold`` (1.5) times as many;
- ``power_of_two``: two workers at random, the less loaded of the two;
- ``random``, ``consistent_hash``, ``sticky_least_loaded``; and ``kv_aware``, which needs the workers' KV-cache
  events over ZMQ (vLLM's ``--kv-events-config``), which ``workbench serve`` does not publish.

The router is one process; it waits for every worker's ``/health`` before it listens, so an answering
``/health`` means it is ready to route.
"""

from __future__ import annotations

import os
import shutil
import sys
from importlib import metadata

from workbench.fleet.processes import ChildProcess, free_port

ROUTER_PACKAGE = "vllm-router"
ROUTER_BINARY = "vllm-router"
POLICIES = ("round_robin", "cache_aware", "power_of_two", "random", "consistent_hash", "sticky_least_loaded")
COMPARED = ("round_robin", "cache_aware", "power_of_two")


class RouterNotFoundError(FileNotFoundError):
    """The vllm-router binary is not installed where this Python can find it."""


def router_binary() -> str:
    """The path of the vllm-router command: beside this Python first (a venv's bin/, which a Jupyter kernel
    need not have on its PATH), then the PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), ROUTER_BINARY)
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    found = shutil.which(ROUTER_BINARY)
    if found:
        return found
    raise RouterNotFoundError(
        f"the router command {ROUTER_BINARY!r} is not installed (looked beside {sys.executable} and on the PATH). "
        f"Install it into this environment: {sys.executable} -m pip install {ROUTER_PACKAGE}==0.1.17 "
        "(a prebuilt Rust binary; it pulls no torch or CUDA)")


def router_version() -> str:
    try:
        return metadata.version(ROUTER_PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown version"


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"unknown routing policy {policy!r}: choose one of {', '.join(POLICIES)} "
                         "(kv_aware needs KV-cache events the workbench's replicas do not publish)")
    return policy


class Router:
    """vllm-router on 127.0.0.1:``port`` over ``worker_urls`` with ``policy``; its own Prometheus endpoint on a
    free port too (its default, 29000, would collide between fleets). ``extra_args`` go to the router as given
    (``--health-check-interval-secs 1``, ``--disable-retries``, ...)."""

    def __init__(self, worker_urls: list[str], policy: str, port: int, *, extra_args: tuple[str, ...] = ()):
        self.policy, self.port, self.worker_urls = check_policy(policy), port, list(worker_urls)
        self.url = f"http://127.0.0.1:{port}"
        self.metrics_port = free_port()
        command = [router_binary(), "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
                   "--worker-urls", *self.worker_urls, "--prometheus-host", "127.0.0.1",
                   "--prometheus-port", str(self.metrics_port), "--worker-startup-check-interval", "1",
                   "--log-level", "warning", *extra_args]
        self.child = ChildProcess(f"router ({policy}, {self.url})", command)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def alive(self) -> bool:
        return self.child.alive

    def start(self, deadline: float) -> Router:
        self.child.start()
        self.child.wait_http(f"{self.url}/health", deadline)
        return self

    def stop(self) -> int | None:
        return self.child.stop()

    def log_tail(self, chars: int = 3000) -> str:
        return self.child.log_tail(chars)
