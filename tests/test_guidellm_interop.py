"""A load generator written elsewhere, guidellm (pinned 0.8.1, in its own ``.venv-guidellm`` that ``make test``
builds), checks our serving stack from the outside, in both directions:

1. guidellm drives a live ``workbench serve`` on the completions and the chat-completions endpoints: no request
   errors in its JSON report, and the TTFT median it measured as a client agrees (within 20%) with the median of
   the server's own ``vllm:time_to_first_token_seconds`` histogram over exactly that run (scraped before and
   after, the difference interpolated in the buckets as PromQL's ``histogram_quantile`` does).
2. ``workbench bench`` drives guidellm's mock OpenAI server, whose TTFT and inter-token latency are set on its
   command line: the TTFT, ITL and TPOT medians our bench reports match those settings.

Two independently written clients and servers meeting in the middle catch what a test of ours against ourselves
cannot: a field one side sends that the other refuses, a stream shape one side cannot parse, a clock started at
a different moment. guidellm needs a tokenizer for its synthetic prompts; it gets the local SmolLM2 folder, with
the Hugging Face hub switched off, so the test runs offline. Every process here runs on 127.0.0.1 on a free
port and is stopped at the end (at exit too). Without ``.venv-guidellm`` (its install failed, or
``make test`` has not run) the module skips and says how to make it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest
from monitoring_helpers import MODEL, tiny_server
from prometheus_client.parser import text_string_to_metric_families

from workbench.fleet.processes import ChildProcess, free_port
from workbench.models.registry import checkpoint_dir
from workbench.monitoring.promql import histogram_quantile

ROOT = Path(__file__).resolve().parents[1]
GUIDELLM = ROOT / ".venv-guidellm" / "bin" / "guidellm"
WORKBENCH = Path(sys.executable).with_name("workbench")  # the entry point of the venv running the tests
TTFT = "vllm:time_to_first_token_seconds"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

pytestmark = [pytest.mark.skipif(not GUIDELLM.exists(), reason="guidellm is not installed in .venv-guidellm "
                                                               "(`make test` or `make guidellm` installs it)"),
              pytest.mark.usefixtures("one_torch_thread")]


def _run(name: str, command: list[str], timeout_s: float) -> str:
    """Run a one-shot program as a ChildProcess (its own process group, killed on timeout); its output."""
    child = ChildProcess(name, command, env=OFFLINE).start()
    try:
        try:
            code = child.process.wait(timeout_s)
        except Exception as exc:  # subprocess.TimeoutExpired
            raise AssertionError(f"{name} ran past {timeout_s} s:\n{child.log_tail()}") from exc
        log = child.log_tail(200_000)
        assert code == 0, f"{name} exited with status {code}:\n{log[-4000:]}"
        return log
    finally:
        child.close()


# --- 1. guidellm against workbench serve ---------------------------------------------------------------------


def _ttft_buckets(url: str) -> dict[float, float]:
    """Cumulative count per upper bound ``le`` of the TTFT histogram (summed over label sets: one model here)."""
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == f"{TTFT}_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
    assert buckets, f"no {TTFT} histogram at {url}/metrics"
    return buckets


# 20 requests, one at a time (guidellm's synthetic data, synchronous profile), each with a fresh prompt (no prefix-
# cache hits) and 8 output tokens. The prompt length is chosen on the spot, from the server's own TTFT for a few
# requests, so that TTFT lands near 75 ms, where vLLM's TTFT buckets are 20 ms wide (0.06, 0.08, 0.1): linear
# interpolation is off by at most half a bucket, 10 ms, and 20% agreement means something. A fixed length cannot do
# that on a shared 2-core machine (512 tokens measured 50 ms on a quiet machine and 135 ms on a busy one). At 40-60
# ms half a bucket plus what guidellm's client adds (5-12 ms measured: it starts its clock at the first header
# write, the server at the parsed body, and the first event crosses from the engine thread to the event loop)
# already make 20%; below 40 ms a bucket is half the value; above 0.1 s the next bucket is 150 ms wide. One request
# at a time keeps queueing out, so both clocks measure the same thing. Other jobs on the machine can still push a
# run up a bucket or two (per-request TTFT from 76 to 395 ms in one run; guidellm's own processes load the CPU too):
# then it runs once more with the length rescaled by the first run's exact mean TTFT (the histogram's _sum over
# _count), and if the median is still in a coarse bucket the test can only check that guidellm's median falls in
# that bucket (its bounds widened by 20%), and prints which check it made.
REQUESTS, OUTPUT_TOKENS, TARGET_TTFT_S = 20, 8, 0.075  # at the server
FINE = (0.06, 0.1)  # 20 ms buckets where half a bucket is at most 1/6 of the value


def _ttft_sum(url: str) -> float:
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == f"{TTFT}_sum":
                return sample.value
    raise AssertionError(f"no {TTFT}_sum at {url}/metrics")


def _server_ttft(url: str, prompt_tokens: int, seed: int) -> float:
    """The server's own TTFT for one request of ``prompt_tokens`` random token ids (distinct per seed: no cache
    hits) and one output token. The server's clock, not ours: a client in this process shares the GIL with the
    server's threads and would read tens of ms late."""
    ids = [(seed * 7919 + i * 104729) % 29000 + 1000 for i in range(prompt_tokens)]
    before = _ttft_sum(url)
    body = {"model": MODEL, "prompt": ids, "max_tokens": 1, "ignore_eos": True}
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
    return _ttft_sum(url) - before


def _prompt_tokens_for(url: str, target_s: float) -> int:
    """The prompt length whose TTFT is ``target_s`` here and now: three rounds of scaling the length by
    target / measured (the median of three requests), which settles where TTFT = target."""
    tokens, seed = 384, 1
    for _ in range(3):
        measured = sorted(_server_ttft(url, tokens, seed + k) for k in range(3))[1]
        seed += 3
        tokens = int(min(2000, max(64, tokens * target_s / max(measured, 1e-3))))
    return tokens


def _guidellm_against(url: str, request_format: str, prompt_tokens: int,
                      report: Path) -> tuple[dict, dict, float]:
    """guidellm's metrics for one synchronous run; the server's TTFT buckets and exact mean TTFT for that run."""
    before, before_sum = _ttft_buckets(url), _ttft_sum(url)
    log = _run("guidellm", [
        str(GUIDELLM), "run",
        "--backend", f"kind=openai_http,target={url},model={MODEL},request_format={request_format}",
        "--profile", "kind=synchronous",
        "--constraint", f"kind=max_requests,count={REQUESTS}",
        "--data", f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={OUTPUT_TOKENS}",
        "--tokenizer", f"kind=hf_auto,model={checkpoint_dir('smollm2-135m')}",
        "--output", f"kind=json,path={report}", "--disable-progress"], timeout_s=180)
    after, after_sum = _ttft_buckets(url), _ttft_sum(url)
    assert report.exists(), f"guidellm wrote no report:\n{log[-4000:]}"
    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    totals = benchmark["metrics"]["request_totals"]
    assert totals["errored"] == 0 and totals["incomplete"] == 0, (totals, log[-4000:])
    run = {le: after[le] - before.get(le, 0.0) for le in after}
    return benchmark["metrics"], run, (after_sum - before_sum) / max(run[float("inf")], 1)


def _median_bucket(run: dict[float, float]) -> tuple[float, float]:
    """The (lower, upper] bounds of the bucket that holds the median observation."""
    ordered = sorted(run.items())
    half = ordered[-1][1] / 2
    lower = 0.0
    for le, count in ordered:
        if count >= half:
            return lower, le
        lower = le
    raise AssertionError(run)


@pytest.mark.parametrize("request_format", ["/v1/completions", "/v1/chat/completions"])
def test_guidellm_against_workbench_serve_agrees_with_the_servers_ttft_histogram(tmp_path, request_format):
    with tiny_server() as server:
        _server_ttft(server.url, 256, 0)  # the first step pays one-time costs that are not TTFT
        # A second try only when the load on the machine moved TTFT out of the fine buckets; never on disagreement.
        prompt_tokens, mean_s = _prompt_tokens_for(server.url, TARGET_TTFT_S), TARGET_TTFT_S
        for attempt in range(2):
            if attempt:  # rescaled from the first run's exact mean TTFT, taken while guidellm itself was running
                prompt_tokens = int(min(2000, max(64, prompt_tokens * TARGET_TTFT_S / max(mean_s, 1e-3))))
            metrics, run, mean_s = _guidellm_against(server.url, request_format, prompt_tokens,
                                             tmp_path / f"guidellm-{attempt}.json")
            lower, upper = _median_bucket(run)
            server_ms = 1000 * histogram_quantile(0.5, run.items())
            client_ms = metrics["time_to_first_token_ms"]["successful"]["median"]
            print(f"{request_format} run {attempt + 1}, {prompt_tokens} prompt tokens: TTFT median guidellm "
                  f"{client_ms:.1f} ms, server histogram {server_ms:.1f} ms (bucket {1000 * lower:g}-"
                  f"{1000 * upper:g} ms; exact server mean {1000 * mean_s:.1f} ms)")
            if FINE[0] <= lower and upper <= FINE[1]:
                break
    assert metrics["request_totals"]["successful"] == REQUESTS, metrics["request_totals"]
    assert metrics["output_token_count"]["successful"]["median"] == OUTPUT_TOKENS  # ignore_eos honoured
    assert run[float("inf")] == REQUESTS, f"the server saw {run[float('inf')]} first tokens for {REQUESTS} requests"
    if FINE[0] <= lower and upper <= FINE[1]:
        assert abs(client_ms - server_ms) <= 0.2 * server_ms, (client_ms, server_ms)
    else:  # a load spike on the shared machine, twice: the histogram only knows the bucket, so check that
        assert 0.8 * 1000 * lower <= client_ms <= 1.2 * 1000 * upper, (client_ms, lower, upper)


# --- 2. workbench bench against guidellm's mock server --------------------------------------------------------

# The mock sleeps TTFT_MS before the first chunk and ITL_MS between chunks (standard deviations 0), and answers
# exactly max_tokens tokens when the request has no stop strings. asyncio.sleep never wakes early, so nothing we
# measure may be shorter (1 ms of slack for the two processes' clocks); the excess is the mock's event-loop
# wake-up, its JSON writes and our parsing, on 2 shared cores: measured +8 ms on TTFT and +0.4 ms on ITL (3-5%).
# Allowed: 15% plus 10 ms for TTFT (it also holds the HTTP round trip), 15% plus 2 ms for ITL and TPOT.
TTFT_MS, ITL_MS, MOCK_TOKENS, MOCK_REQUESTS = 150.0, 15.0, 24, 16


def _within(measured_ms: float, configured_ms: float, extra_ms: float) -> bool:
    return configured_ms - 1.0 <= measured_ms <= 1.15 * configured_ms + extra_ms


@pytest.fixture
def mock_server():
    url = f"http://127.0.0.1:{free_port()}"
    host, port = url.removeprefix("http://").split(":")
    child = ChildProcess("guidellm mock-server", [
        str(GUIDELLM), "mock-server", "--host", host, "--port", port, "--workers", "1", "--model", "mock-model",
        "--ttft-ms", str(TTFT_MS), "--ttft-ms-std", "0", "--itl-ms", str(ITL_MS), "--itl-ms-std", "0",
        "--output-tokens", str(MOCK_TOKENS), "--output-tokens-std", "0"], env=OFFLINE).start()
    try:
        child.wait_http(f"{url}/v1/models", time.monotonic() + 60)
        yield url
    finally:
        child.close()


def test_workbench_bench_measures_what_guidellms_mock_server_was_set_to(tmp_path, mock_server):
    workload = tmp_path / "mock.jsonl"
    workload.write_text("".join(json.dumps({"prompt": f"Question {i}: why do bicycles stay upright?",
                                            "max_tokens": MOCK_TOKENS}) + "\n" for i in range(MOCK_REQUESTS)))
    for endpoint in ("completions", "chat"):
        log = _run("workbench bench", [str(WORKBENCH), "bench", "--base-url", mock_server, "--workload",
                                       str(workload), "--endpoint", endpoint, "--concurrency", "4",
                                       "--no-progress"], timeout_s=120)
        summary = json.loads(log.strip().splitlines()[-1])["summary"]
        assert summary["completed"] == MOCK_REQUESTS and summary["failed"] == 0, log[-3000:]
        assert summary["output_tokens"] == MOCK_REQUESTS * MOCK_TOKENS, summary
        measured = {k: summary[f"{k}_median_ms"] for k in ("ttft", "itl", "tpot")}
        print(f"{endpoint}: configured TTFT {TTFT_MS} ms, ITL {ITL_MS} ms; measured medians {measured}")
        assert _within(measured["ttft"], TTFT_MS, 10.0), (endpoint, measured)
        assert _within(measured["itl"], ITL_MS, 2.0), (endpoint, measured)
        assert _within(measured["tpot"], ITL_MS, 2.0), (endpoint, measured)

