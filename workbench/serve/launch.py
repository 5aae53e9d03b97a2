"""Running the server: in the foreground (``workbench serve``), in a thread over an engine you already have
(notebooks, tests), or as a child process (``workbench bench --start-server``, the serving benchmark).

Shutdown is the same everywhere: stop accepting connections, let running requests finish for a grace period,
abort the rest (their clients get ``finish_reason: "abort"`` and ``[DONE]``, not a cut connection), then stop
the engine thread. uvicorn calls it on SIGINT/SIGTERM in the foreground and on ``stop()`` in a thread.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import torch
import uvicorn

from workbench.engine.llm_engine import LLMEngine
from workbench.serve.app import create_app
from workbench.serve.engine_loop import EngineLoop
from workbench.serve.guards import DEFAULT_MAX_BODY_BYTES, exposure_warning
from workbench.serve.options import DEFAULT_SHUTDOWN_GRACE_S, api_key_from, engine_configs

# After the grace period and the aborts, what uvicorn still waits for open responses to flush.
FLUSH_TIMEOUT_S = 5.0


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, with the engine drained between closing the listeners and closing connections."""

    def __init__(self, config: uvicorn.Config, engine_loop: EngineLoop, grace_s: float):
        super().__init__(config)
        self.engine_loop, self.grace_s = engine_loop, grace_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        await self.engine_loop.drain(self.grace_s)
        await super().shutdown(sockets)


def _check_listen_options(port: int, grace_s: float) -> None:
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in [0, 65535], got {port}")
    if grace_s < 0:
        raise ValueError(f"the shutdown grace must be >= 0 seconds, got {grace_s}")


def _server(engine: LLMEngine, host: str, port: int, *, grace_s: float, log_level: str = "warning",
            **app_options) -> _DrainingServer:
    _check_listen_options(port, grace_s)
    app = create_app(engine, **app_options)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=FLUSH_TIMEOUT_S)
    return _DrainingServer(config, app.state.engine_loop, grace_s)


def serve_from_args(args: argparse.Namespace) -> None:
    """``workbench serve``: load the engine, then serve until SIGINT/SIGTERM."""
    _check_listen_options(args.port, args.shutdown_grace)  # before the model loads, not after
    api_key = api_key_from(args)
    warning = exposure_warning(args.host, api_key)
    if warning:
        print(warning, file=sys.stderr)
    configs = engine_configs(args)
    engine = LLMEngine.from_pretrained(args.model, device=args.device, dtype=getattr(torch, args.dtype),
                                       weights=args.weights, **configs)
    server = _server(engine, args.host, args.port, grace_s=args.shutdown_grace, log_level=args.log_level,
                     model_name=args.served_model_name or args.model, api_key=api_key,
                     max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES)
    print(f"serving {args.served_model_name or args.model} at http://{args.host}:{args.port} "
          f"({engine.model.device}, {args.dtype}, weights {args.weights}, {engine.blocks.num_blocks} KV blocks of "
          f"{engine.cache_config.block_size})", file=sys.stderr, flush=True)
    if engine.kv_offload is not None:
        print(f"second KV tier: {engine.kv_offload.describe()}", file=sys.stderr, flush=True)
    server.run()


class ServerThread:
    """The server over an existing engine, on 127.0.0.1 and a free port, in a background thread.

        with ServerThread(engine) as server:
            run_benchmark(server.url, workload)
    """

    def __init__(self, engine: LLMEngine, *, host: str = "127.0.0.1", grace_s: float = 0.0,
                 start_timeout_s: float = 30.0, **app_options):
        # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and without it
        # every response on a keep-alive connection waited ~40 ms (Nagle against the client's delayed ACK).
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM,
                                   socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))  # the OS picks a free port; the bound socket goes to uvicorn, no race
        self.host, self.port = host, self._sock.getsockname()[1]
        self._server = _server(engine, host, self.port, grace_s=grace_s, **app_options)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="uvicorn", daemon=True)
        self.start_timeout_s = start_timeout_s

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def engine_loop(self) -> EngineLoop:
        return self._server.engine_loop

    def start(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start within {self.start_timeout_s} s")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``workbench serve`` as a child process on 127.0.0.1 and a free port; waits until /health answers."""

    def __init__(self, extra_args: list[str] | tuple[str, ...] = (), *, start_timeout_s: float = 180.0,
                 grace_s: float = DEFAULT_SHUTDOWN_GRACE_S, log_level: str = "warning"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "workbench.cli", "serve", "--host", "127.0.0.1", "--port",
                        str(self.port), "--shutdown-grace", str(grace_s), "--log-level", log_level, *extra_args]
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen | None = None
        # A file, not a pipe: a full pipe nobody reads would block the server. Closed with the object.
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's stderr."""
        self._log.flush()
        self._log.seek(0)
        return self._log.read()[-chars:]

    def start(self) -> ServerProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(self.command, env=env, stdout=subprocess.DEVNULL, stderr=self._log,
                                        text=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not answer /health within {self.start_timeout_s} s")

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (a graceful shutdown), then SIGKILL if it does not exit in time; returns the exit status."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
