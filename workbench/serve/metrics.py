"""Prometheus metrics under vLLM's V1 names, so dashboards and alerts written for vLLM read this server.

Names, types, labels (``model_name`` and ``engine``, the engine's index: always "0" here, one engine per
server) and histogram buckets follow vLLM's V1 ``PrometheusStatLogger`` (vLLM 0.10-0.11's
``vllm/v1/metrics/loggers.py``): counters appear as ``vllm:<name>_total`` in the text exposition, token counts
are in tokens, times in seconds, ``kv_cache_usage_perc`` is a fraction (1 = full). Each server owns its
``CollectorRegistry`` (with the process and platform collectors vLLM's default registry carries), so several
servers (or test fixtures) in one process never share or clash over series. A few series come from newer vLLM, for
the dashboards vLLM ships in examples/observability (tests/monitoring/test_prometheus_real.py asks them all):
``prompt_tokens_by_source``, ``prompt_tokens_cached_by_source``, ``request_prefill_kv_computed_tokens`` and
``engine_sleep_state``.

Timing as vLLM observes it: the time to first token and the inter-token latency are observed **per engine
step, as tokens are produced** (``record_progress``), so a live dashboard does not lag by a whole request, and
a speculative step that emits several tokens gives one inter-token sample, not one per token (zeros); the
time per output token is observed for every finished request (0 for a one-token request, as vLLM does).

Only the engine thread writes here (after each step, from the engine's own records: sequences' token times,
step records, finished sequences, the block manager's prefix-cache counters), so the numbers agree with the
engine's pandas frames; prometheus-client's metric objects are thread-safe for the scrape that reads them.
"""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)

from workbench.engine.sequence import Sequence
from workbench.metrics.recorder import StepRecord
from workbench.serve.offload_metrics import OffloadSeries

# vLLM's buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                         20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# vLLM's finish reasons (vllm/v1/engine/__init__.py FINISH_REASON_STRINGS), all pre-created as vLLM does; "error" is
# an engine failure; "repetition" (vLLM's repetition_detection, refused here) stays 0.
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
ENGINE_INDEX = "0"
# vLLM's reasons a request waits: no room in the KV pool or the step's budget ("capacity"), or held back by the
# scheduler's policy ("deferred"). This engine's scheduler only ever waits for capacity.
WAITING_REASONS = ("capacity", "deferred")
# vLLM's sources of a prompt token's KV (vllm/v1/metrics/stats.py PromptTokenStats): computed by prefill, found in
# the local prefix cache, or loaded through a KV connector (which this engine does not have: that one stays 0).
PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
# vLLM's tiers a cached prompt token can come from: the KV pool ("device"), and with a second KV tier "host" or
# "disk" (workbench.serve.offload_metrics).
CACHE_TIERS = ("device", "host", "p2p", "disk", "external_unspecified")
# vLLM's engine sleep states (sleep mode offloads or discards the weights); this engine is always awake.
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")


def one_two_five_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's buckets for token counts)."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


class ServingMetrics:
    """The server's Prometheus series for one served model."""

    def __init__(self, model_name: str, max_model_len: int, cache_config: dict[str, object] | None = None):
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.registry.register(PLATFORM_COLLECTOR)
        self.registry.register(GC_COLLECTOR)  # python_gc_*, as vLLM's default registry has
        self.model_name = model_name
        self._choices_left: dict[str, tuple[int, int]] = {}  # request id -> (choices still running, longest so far)
        self._build_scheduler_series()
        self._build_request_series(max_model_len)
        self._build_spec_series()
        self.offload: OffloadSeries | None = None
        self._cache_info: tuple[Info, dict[str, str]] | None = None
        if cache_config is not None:
            info = Info("vllm:cache_config", "Information of the engine's cache configuration.",
                        registry=self.registry)
            values = {**{key: str(value) for key, value in cache_config.items()}, "engine": ENGINE_INDEX}
            info.info(values)
            self._cache_info = (info, values)

    def attach_offload(self, tier) -> None:
        """Register the series of the engine's second KV tier (`workbench.cache.tier.tier.KVTier`); a server
        without one exports none of them. vLLM's cache_config_info then names the tier's size in blocks."""
        if tier is None or self.offload is not None:
            return
        self.offload = OffloadSeries(self.registry, (self.model_name, ENGINE_INDEX), tier, self.cached_by_tier)
        if self._cache_info is not None:
            info, values = self._cache_info
            info.info({**values, "num_cpu_blocks": str(tier.store.capacity_bytes // tier.store.bytes_per_block)})

    # ---------------------------------------------------------------------------------------- definitions
    def _labelled(self, kind, name: str, doc: str, **kwargs):
        return kind(name, doc, ["model_name", "engine"], registry=self.registry, **kwargs).labels(self.model_name,
                                                                                                  ENGINE_INDEX)

    def _by(self, kind, name: str, doc: str, label: str, values: tuple[str, ...], **kwargs) -> dict:
        metric = kind(name, doc, ["model_name", "engine", label], registry=self.registry, **kwargs)
        return {value: metric.labels(self.model_name, ENGINE_INDEX, value) for value in values}

    def _build_scheduler_series(self) -> None:
        self.running = self._labelled(Gauge, "vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = self._labelled(Gauge, "vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.waiting_by_reason = self._by(Gauge, "vllm:num_requests_waiting_by_reason", "Waiting requests, by why.",
                                          "reason", WAITING_REASONS)
        self.kv_usage = self._labelled(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent.")
        self.prefix_queries = self._labelled(Counter, "vllm:prefix_cache_queries",
                                             "Prefix cache queries, in prompt tokens looked up.")
        self.prefix_hits = self._labelled(Counter, "vllm:prefix_cache_hits",
                                          "Prefix cache hits, in prompt tokens served from the cache.")
        self.preemptions = self._labelled(Counter, "vllm:num_preemptions", "Preemptions by the scheduler.")
        self.iteration_tokens = self._labelled(Histogram, "vllm:iteration_tokens_total", "Tokens per engine step.",
                                               buckets=ITERATION_TOKEN_BUCKETS)
        self.cached_by_tier = self._by(Counter, "vllm:prompt_tokens_cached_by_source",
                                       "Prompt tokens found cached at admission, by the cache tier that held them.",
                                       "source", CACHE_TIERS)
        sleep_state = self._by(Gauge, "vllm:engine_sleep_state", "Engine sleep state: awake = 1 while awake.",
                               "sleep_state", SLEEP_STATES)
        sleep_state["awake"].set(1)

    def _build_request_series(self, max_model_len: int) -> None:
        self.prompt_tokens = self._labelled(Counter, "vllm:prompt_tokens", "Prompt tokens of requests prefilled.")
        self.generation_tokens = self._labelled(Counter, "vllm:generation_tokens", "Tokens generated.")
        self.cached_prompt_tokens = self._labelled(Counter, "vllm:prompt_tokens_cached",
                                                   "Prompt tokens whose KV came from the prefix cache.")
        self.prompt_tokens_by_source = self._by(Counter, "vllm:prompt_tokens_by_source",
                                                "Prompt tokens, by where their KV came from.", "source",
                                                PROMPT_TOKEN_SOURCES)
        self.success = self._by(Counter, "vllm:request_success", "Finished requests, by finish reason.",
                                "finished_reason", FINISH_REASONS)
        token_buckets = one_two_five_buckets(max_model_len)
        self.request_prompt_tokens = self._labelled(Histogram, "vllm:request_prompt_tokens",
                                                    "Prompt tokens per finished request.", buckets=token_buckets)
        self.prefill_computed_tokens = self._labelled(Histogram, "vllm:request_prefill_kv_computed_tokens",
                                                      "Prompt tokens per finished request whose KV prefill computed "
                                                      "(not found cached).", buckets=token_buckets)
        self.request_generation_tokens = self._labelled(Histogram, "vllm:request_generation_tokens",
                                                        "Generated tokens per finished request.",
                                                        buckets=token_buckets)
        self.max_generation_tokens = self._labelled(Histogram, "vllm:request_max_num_generation_tokens",
                                                    "The most tokens one choice of a finished request generated.",
                                                    buckets=token_buckets)
        self.params_n = self._labelled(Histogram, "vllm:request_params_n", "The n parameter of finished requests.",
                                       buckets=(1, 2, 5, 10, 20))
        self.params_max_tokens = self._labelled(Histogram, "vllm:request_params_max_tokens",
                                                "The max_tokens parameter of finished requests.",
                                                buckets=token_buckets)
        self.ttft = self._labelled(Histogram, "vllm:time_to_first_token_seconds", "Time to first token.",
                                   buckets=TTFT_BUCKETS)
        self.itl = self._labelled(Histogram, "vllm:inter_token_latency_seconds",
                                  "Time between consecutive output tokens.", buckets=TOKEN_LATENCY_BUCKETS)
        self.tpot = self._labelled(Histogram, "vllm:request_time_per_output_token_seconds",
                                   "Mean time per output token after the first, per request.",
                                   buckets=TOKEN_LATENCY_BUCKETS)
        self.e2e = self._labelled(Histogram, "vllm:e2e_request_latency_seconds", "Arrival to finish.",
                                  buckets=REQUEST_LATENCY_BUCKETS)
        self.queue_time = self._labelled(Histogram, "vllm:request_queue_time_seconds",
                                         "Queued in the engine to first scheduled.", buckets=REQUEST_LATENCY_BUCKETS)
        self.inference_time = self._labelled(Histogram, "vllm:request_inference_time_seconds",
                                             "First scheduled to finish.", buckets=REQUEST_LATENCY_BUCKETS)
        self.prefill_time = self._labelled(Histogram, "vllm:request_prefill_time_seconds",
                                           "First scheduled to first token.", buckets=REQUEST_LATENCY_BUCKETS)
        self.decode_time = self._labelled(Histogram, "vllm:request_decode_time_seconds",
                                          "First token to last token.", buckets=REQUEST_LATENCY_BUCKETS)

    def _build_spec_series(self) -> None:
        self.spec_drafts = self._labelled(Counter, "vllm:spec_decode_num_drafts", "Speculative verification passes.")
        self.spec_draft_tokens = self._labelled(Counter, "vllm:spec_decode_num_draft_tokens", "Tokens drafted.")
        self.spec_accepted = self._labelled(Counter, "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self._accepted_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                         "Draft tokens accepted, by draft position (0 = first).",
                                         ["model_name", "engine", "position"], registry=self.registry)

    # ------------------------------------------------------------------------------------------- updates
    def record_step(self, step: StepRecord) -> None:
        self.preemptions.inc(step.preemptions)
        self.iteration_tokens.observe(step.num_prefill_tokens + step.num_decode_tokens)

    def record_scheduler(self, running: int, waiting: int, kv_usage: float, prefix_queries: int,
                         prefix_hits: int) -> None:
        """Gauges now, and the prefix-cache counters' growth since the last call."""
        self.running.set(running)
        self.waiting.set(waiting)
        self.waiting_by_reason["capacity"].set(waiting)
        self.kv_usage.set(kv_usage)
        self.prefix_queries.inc(prefix_queries)
        self.prefix_hits.inc(prefix_hits)
        self.cached_by_tier["device"].inc(prefix_hits)

    def record_tokens(self, prompt_tokens: int, generation_tokens: int, cached_prompt_tokens: int = 0,
                      restored_prompt_tokens: int = 0) -> None:
        """Token counters; a request's prompt is counted once, when its first token comes (as vLLM counts it at
        prefill), split by source: ``cached_prompt_tokens`` of it came from the prefix cache, of which
        ``restored_prompt_tokens`` from the second KV tier (vLLM counts a connector's as external_kv_transfer)."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generation_tokens)
        cached = min(cached_prompt_tokens, prompt_tokens)
        restored = min(restored_prompt_tokens, cached)
        self.prompt_tokens_by_source["local_cache_hit"].inc(cached - restored)
        self.prompt_tokens_by_source["external_kv_transfer"].inc(restored)
        self.prompt_tokens_by_source["local_compute"].inc(prompt_tokens - cached)

    def record_offload(self, tier) -> None:
        """The second KV tier's counters' growth since the last call (no-op without a tier)."""
        if self.offload is not None and tier is not None:
            self.offload.export(tier)

    def record_progress(self, seq: Sequence, times_seen: int) -> int:
        """Observe what one sequence produced since ``times_seen`` of its token times were observed: its time to
        first token when the first arrives, one inter-token latency per step that produced tokens after that
        (several tokens from one speculative step are one sample, as in vLLM). Returns the new count."""
        times = seq.token_times
        if len(times) <= times_seen:
            return times_seen
        if times_seen == 0:
            self.ttft.observe(times[0] - seq.arrival_time)
        else:
            self.itl.observe(times[-1] - times[times_seen - 1])
        return len(times)

    def record_finished(self, seq: Sequence, *, error: bool = False) -> None:
        """Per-request histograms from one finished sequence's timeline (the recorder's own fields); its TTFT
        and ITL samples were observed by ``record_progress`` as its tokens came."""
        reason = "error" if error else seq.finish_reason.value if seq.finish_reason else "abort"
        self.success[reason].inc()
        self.request_prompt_tokens.observe(len(seq.prompt_ids))
        self.prefill_computed_tokens.observe(len(seq.prompt_ids) - max(seq.num_cached_prompt_tokens, 0))
        self.request_generation_tokens.observe(len(seq.output_ids))
        self.params_max_tokens.observe(seq.params.max_tokens)
        self._record_choice_finished(seq)
        self.cached_prompt_tokens.inc(seq.num_cached_prompt_tokens)
        times, scheduled = seq.token_times, seq.first_scheduled_time
        if seq.finish_time is not None:
            self.e2e.observe(seq.finish_time - seq.arrival_time)
            if scheduled is not None:
                self.inference_time.observe(seq.finish_time - scheduled)
        if scheduled is not None:
            self.queue_time.observe(scheduled - seq.queued_time)
            if times:
                self.prefill_time.observe(times[0] - scheduled)
        if times:
            self.decode_time.observe(times[-1] - times[0])
            self.tpot.observe((times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0)
        spec = seq.spec
        if spec.passes:
            self.spec_drafts.inc(spec.passes)
            self.spec_draft_tokens.inc(spec.drafted)
            self.spec_accepted.inc(spec.accepted)
            for position, accepted in enumerate(spec.accepted_at):
                self._accepted_per_pos.labels(self.model_name, ENGINE_INDEX, str(position)).inc(accepted)

    def _record_choice_finished(self, seq: Sequence) -> None:
        """The series vLLM observes once per request, not per choice (``n`` and the longest choice), observed when
        the last of a request's ``n`` sequences finishes; the others above count every sequence, as vLLM's do."""
        left, longest = self._choices_left.pop(seq.request_id, (seq.params.n, 0))
        left, longest = left - 1, max(longest, seq.num_output_tokens)
        if left > 0:
            self._choices_left[seq.request_id] = (left, longest)
            return
        self.params_n.observe(seq.params.n)
        self.max_generation_tokens.observe(longest)

    def exposition(self) -> bytes:
        """The Prometheus text format (version 0.0.4) of every series."""
        return generate_latest(self.registry)
