"""``workbench serve`` as a real process: SIGTERM lets a short request finish, aborts a long one after the grace
period (its client still gets a final chunk and [DONE], not a cut connection), and the process exits without
errors."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest
from serve_helpers import MODEL

from workbench.serve.launch import ServerProcess

GRACE_S = 8.0  # long enough for the short request to finish on a busy 2-core machine


def _read_stream(url: str, body: dict, events: list, first_chunk: threading.Event) -> None:
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        if response.status_code != 200:
            events.append(response.read().decode())
            first_chunk.set()
            return
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                events.append(data if data == "[DONE]" else json.loads(data))
                first_chunk.set()


@pytest.mark.slow
def test_sigterm_drains_then_aborts_and_exits_cleanly():
    # int8 weights: the server's --weights reaches the engine (shutdown does not care which weights it serves).
    server = ServerProcess(["--num-blocks", "160", "--weights", "int8"], grace_s=GRACE_S)  # room for 2560 tokens
    with server:
        assert "weights int8" in server.log_tail(), server.log_tail()
        long_events: list = []
        short_events: list = []
        started = [threading.Event(), threading.Event()]
        base = {"model": MODEL, "prompt": "Tell me a story.", "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        readers = [threading.Thread(target=_read_stream, args=(server.url, {**base, "max_tokens": 2000},
                                                               long_events, started[0])),
                   threading.Thread(target=_read_stream, args=(server.url, {**base, "max_tokens": 4},
                                                               short_events, started[1]))]
        for reader in readers:
            reader.start()
        assert all([event.wait(120) for event in started]), server.log_tail()
        assert all(isinstance(events[0], dict) for events in (long_events, short_events)), (long_events, short_events)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        for reader in readers:
            reader.join(60)
        assert not any(reader.is_alive() for reader in readers)
        status = server.process.wait(60)
        # uvicorn re-raises the signal once its graceful shutdown is done, so a supervisor sees how it ended.
        assert status in (0, -signal.SIGTERM), server.log_tail()
        assert "Traceback" not in server.log_tail()
        assert time.monotonic() - signalled < GRACE_S + 30

    for events, reason in ((short_events, "length"), (long_events, "abort")):
        assert events[-1] == "[DONE]", events[-3:]
        finals = [c["finish_reason"] for e in events[:-1] for c in e["choices"] if c["finish_reason"]]
        assert finals == [reason]
        assert events[-2]["usage"]["completion_tokens"] > 0
    assert long_events[-2]["usage"]["completion_tokens"] < 2000
    with pytest.raises(httpx.TransportError):  # the port is closed
        httpx.get(f"{server.url}/health", timeout=2)
