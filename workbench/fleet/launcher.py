"""A fleet: N ``workbench serve`` replicas on free local ports, each on its share of the cores with its own KV
pool, and vllm-router in front, started together and always stopped together.

    with Fleet(replicas=2, policy="cache_aware") as fleet:
        run_benchmark(fleet.url, workload)       # the router's URL: any OpenAI client works against it
        fleet.set_policy("round_robin")          # a new router over the same replicas (their caches stay warm)

The replicas start in parallel (each loads the model on its own cores); the router starts once every one
answers ``/health``. Anything that fails on the way stops what had started before the error is raised, so a
failed or interrupted start leaves no process behind (see `workbench.fleet.processes` for the other guards).
"""

from __future__ import annotations

import time

from workbench.fleet.processes import check_port_free, cpu_shares, free_port
from workbench.fleet.replica import Replica, ReplicaOptions
from workbench.fleet.router import Router, check_policy, router_binary, router_version

DEFAULT_START_TIMEOUT_S = 240.0  # two replicas loading the model at once on a busy 2-core machine took ~30 s


class Fleet:
    """``replicas`` replicas (``options``: model, KV pool, batch limit) behind vllm-router with ``policy``.

    ``router_port`` and ``replica_ports`` are chosen free when left out; given, each must be free
    (PortTakenError otherwise). ``router_args`` go to every router this fleet starts."""

    def __init__(self, replicas: int = 2, *, policy: str = "cache_aware", options: ReplicaOptions | None = None,
                 router_port: int | None = None, replica_ports: list[int] | None = None,
                 router_args: tuple[str, ...] = (), start_timeout_s: float = DEFAULT_START_TIMEOUT_S):
        if not isinstance(replicas, int) or not 1 <= replicas <= 16:
            raise ValueError(f"replicas must be an integer in [1, 16], got {replicas!r}")
        if replica_ports is not None and len(replica_ports) != replicas:
            raise ValueError(f"give one port per replica: {replicas} replicas, {len(replica_ports)} ports")
        self.policy = check_policy(policy)
        router_binary()  # a missing router is an error before anything starts
        self.options = options or ReplicaOptions()
        self.router_args = tuple(router_args)
        self.start_timeout_s = start_timeout_s
        self._size = replicas
        self._router_port = router_port
        self._replica_ports = replica_ports
        self.replicas: list[Replica] = []
        self.router: Router | None = None
        self.started = False

    # ---- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> Fleet:
        if self.started:
            raise RuntimeError("this fleet is already running")
        if self._router_port is not None:
            check_port_free(self._router_port, what="the router")
        ports = self._replica_ports
        if ports is not None:
            for port in ports:
                check_port_free(port, what="a replica")
        else:
            ports = [free_port() for _ in range(self.size)]
        shares = cpu_shares(self.size)
        self.replicas = [Replica(i, port, cpus, self.options) for i, (port, cpus) in enumerate(zip(ports, shares,
                                                                                                  strict=True))]
        self.started = True
        try:
            deadline = time.monotonic() + self.start_timeout_s
            for replica in self.replicas:
                replica.start()
            for replica in self.replicas:
                replica.wait_ready(deadline)
            self._start_router(self.policy)
        except BaseException:  # KeyboardInterrupt included: an interrupted start leaves nothing running
            self.stop()
            raise
        return self

    @property
    def size(self) -> int:
        return self._size

    def _start_router(self, policy: str) -> None:
        port = self._router_port if self._router_port is not None else free_port()
        self.router = Router([r.url for r in self.replicas if r.alive], policy, port, extra_args=self.router_args)
        self.router.start(time.monotonic() + 60.0)
        self.policy = policy

    def set_policy(self, policy: str, *, router_args: tuple[str, ...] | None = None) -> Fleet:
        """Replace the router with one running ``policy`` over the same (live) replicas; their caches stay."""
        check_policy(policy)
        self._need_running()
        if router_args is not None:
            self.router_args = tuple(router_args)
        if self.router is not None:
            self.router.stop()
        try:
            self._start_router(policy)
        except BaseException:
            self.stop()
            raise
        return self

    def restart_replica(self, index: int) -> Replica:
        """Start replica ``index`` again (after a crash) on its port and cores, then a new router over all."""
        self._need_running()
        old = self.replicas[index]
        old.child.close()
        new = Replica(index, old.port, old.cpus, self.options)
        self.replicas[index] = new
        try:
            new.start().wait_ready(time.monotonic() + self.start_timeout_s)
            self.set_policy(self.policy)
        except BaseException:
            self.stop()
            raise
        return new

    def stop(self) -> None:
        """Stop the router, then every replica; safe to call twice, and after a failure."""
        if self.router is not None:
            self.router.stop()
        for replica in self.replicas:
            replica.stop()
        self.started = False

    def close(self) -> None:
        self.stop()
        for child in self.children():
            child.close()

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- what it is ----------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The router's URL: where clients send requests."""
        self._need_running()
        return self.router.url

    @property
    def replica_urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def children(self) -> list:
        return ([self.router.child] if self.router is not None else []) + [r.child for r in self.replicas]

    def pids(self) -> list[int]:
        """The process ids of the router and every replica that was started."""
        return [c.pid for c in self.children() if c.pid is not None]

    def counters(self) -> list[dict[str, float]]:
        """Each live replica's counters (`Replica.counters`), with its index; a dead one reads as None."""
        out = []
        for replica in self.replicas:
            values = replica.counters() if replica.alive else None
            out.append({"replica": replica.index, "alive": replica.alive, **(values or {})})
        return out

    def describe(self) -> str:
        lines = [f"vllm-router {router_version()} ({self.policy}) at {self.router.url if self.router else '-'}"]
        return "\n".join(lines + [f"  {r.describe()}" for r in self.replicas])

    def _need_running(self) -> None:
        if not self.started or self.router is None:
            raise RuntimeError("the fleet is not running: use `with Fleet(...) as fleet:` or fleet.start()")

    def __repr__(self) -> str:
        state = "running" if self.started else "stopped"
        return f"Fleet({self.size} replicas, {self.policy}, {state})"

