"""A fuzzer written elsewhere, schemathesis (pinned 4.32.5, in its own ``.venv-schemathesis`` that ``make test``
builds), drives a live ``workbench serve`` from nothing but the server's own ``/openapi.json``.

It generates valid and invalid requests for every operation (its examples, coverage and fuzzing phases: boundary
values such as ``top_p: 5e-324``, wrong types, missing fields, wrong methods and media types) and runs
``not_a_server_error`` and the response-conformance checks (status codes, media types, headers and bodies as the
document describes them). Afterwards the server's own books must agree: no 5xx in its HTTP route series, no request
finished with an engine error, and nothing left running: the fuzzer gives up on slow requests, and a request whose
client left must be aborted (running and waiting back to 0, the KV cache back to idle).

The engine is a 2-layer model with random weights and the real tokenizer, with a 16-block KV pool and at most 8
sequences, so that what the fuzzer asks the engine (a chat without max_tokens runs to the end of the pool) stays
short; every HTTP path it reaches is the real server's. Bounded by ``--max-examples`` and a fixed seed (the same
cases every run): about 1,500 requests in 30-60 s on 2 cores. Without ``.venv-schemathesis`` (its install failed,
or ``make test`` has not run) the module skips and says how to make it.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import torch
from serve_helpers import make_engine, metric_total, running_server, scrape, wait_metrics_idle

import workbench
from workbench.config import SchedulerConfig

ROOT = Path(__file__).resolve().parents[2]
ST = ROOT / ".venv-schemathesis" / "bin" / "st"
KEY = "fuzz-key"
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
          "response_schema_conformance")
RUN_TIMEOUT_S = 300

pytestmark = [pytest.mark.external,
              pytest.mark.skipif(not ST.exists(), reason="schemathesis is not installed in .venv-schemathesis "
                                                         "(`make test` or `make schemathesis` installs it)"),
              pytest.mark.usefixtures("one_torch_thread")]


def test_schemathesis_finds_no_server_error_and_leaves_nothing_running(tmp_path, tokenizer):
    torch.manual_seed(0)
    model = workbench.random_model("smollm2-135m", num_layers=2, device="cpu")
    engine = make_engine(model, tokenizer, num_blocks=16, scheduler_config=SchedulerConfig(max_num_seqs=8))
    with running_server(engine, api_key=KEY) as server:
        command = [str(ST), "run", f"{server.url}/openapi.json", "--checks", CHECKS, "--workers", "1",
                   "--phases", "examples,coverage,fuzzing", "--max-examples", "15", "--seed", "1",
                   "--request-timeout", "20", "--continue-on-failure", "--generation-database", "none",
                   "--no-color", "-H", f"Authorization: Bearer {KEY}"]
        started = time.monotonic()
        run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                             env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1"})
        elapsed = time.monotonic() - started
        log = run.stdout + run.stderr
        generated = re.search(r"(\d+) generated", log)
        print(f"schemathesis: {generated.group(1) if generated else '?'} test cases in {elapsed:.0f} s")
        assert run.returncode == 0, f"schemathesis found failures:\n{log[-8000:]}"
        assert generated and int(generated.group(1)) > 500, log[-3000:]
        gauges = wait_metrics_idle(server.url)
        samples = scrape(server.url)
        served = metric_total(samples, "http_requests_total")
        assert metric_total(samples, "http_requests_total", status="5xx") == 0
        assert metric_total(samples, "http_requests_total", status="2xx") > 100 and served > 500
        assert metric_total(samples, "vllm:request_success_total", finished_reason="error") == 0
        assert metric_total(samples, "vllm:request_success_total") > 50  # the fuzzer's requests reached the engine
        print(f"server: {served:.0f} requests, 0 x 5xx; after the run {gauges}")
