"""`make lab`, the README's first command, as a workshop container runs it: as root. The test takes the jupyter
command line the Makefile would run (`make -n lab`), starts it on a free loopback port with a token, waits for the
server to answer and stops it; as root the line must carry --allow-root (JupyterLab exits at once without it).
The lab-wide settings the Makefile ships in the venv must reach the server (no "get Jupyter news?" toast)."""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from browser_helpers import free_port

from workbench.fleet.processes import ChildProcess

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.external]  # drives JupyterLab


def _make(*args: str) -> str:
    done = subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def lab_command() -> list[str]:
    """The jupyter line of `make -n lab` (set-up lines, if any are due, are only printed, never run)."""
    lines = [line for line in _make("-n", "lab").splitlines() if " lab " in f"{line} " and "jupyter" in line]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def test_the_makefile_lab_command_starts_as_the_current_user(tmp_path):
    _make("lab-settings")
    command = lab_command()
    assert command[0].endswith("bin/jupyter") and command[1] == "lab"
    assert "--ServerApp.root_dir=notebooks" in command
    assert ("--allow-root" in command) == (os.geteuid() == 0)
    port, token = free_port(), secrets.token_hex(16)
    server = ChildProcess("make lab's JupyterLab", [str(ROOT / command[0]), *command[1:], "--no-browser",
                                                   f"--port={port}", "--ServerApp.ip=127.0.0.1",
                                                   f"--IdentityProvider.token={token}"],
                          env={"JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")})
    base = f"http://127.0.0.1:{port}"
    try:
        server.start()
        server.wait_http(f"{base}/api/status?token={token}", time.monotonic() + 90)
        chapters = httpx.get(f"{base}/api/contents?token={token}", timeout=10).json()["content"]
        assert any(item["name"].startswith("ch01_") for item in chapters)  # root_dir is notebooks/
        notification = httpx.get(f"{base}/lab/api/settings/@jupyterlab/apputils-extension:notification"
                                 f"?token={token}", timeout=10).json()
        # Overrides become the schema's defaults (a user's own setting would still win).
        assert notification["schema"]["properties"]["fetchNews"]["default"] == "false", notification["schema"]
    finally:
        server.close()
    assert "Running as root is not recommended" not in server.log_tail(20_000)
