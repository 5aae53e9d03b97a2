"""What the browser tests share: Debian's Chromium, the flags a machine with a closed network needs, and a free
loopback port."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
# The machine's network is closed: no QUIC, no background fetches, no component updates.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def require_chromium() -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"Chromium is not installed at {CHROMIUM}: run `apt-get install -y chromium` (.ci/run does)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
