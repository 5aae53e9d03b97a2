"""The one thread that owns the engine while it serves: commands in, steps, events out.

``LLMEngine`` is not thread-safe, and it does not need to be: this thread is the only one that touches it.
HTTP handlers (on uvicorn's event loop) send *commands* — add a request, abort one, read a number — as closures
through a queue; the thread runs them between steps and resolves each one's future. Commands are short: request
text is tokenized before it gets here, on the text workers (`workbench.serve.text_workers`). After each
``step()`` it turns the outputs into per-request deltas (``RequestStream``), and feeds the Prometheus series
from the engine's own records. Scheduling stays entirely the engine's: the loop only decides *when* to call
``step()`` (whenever a request is unfinished) and sleeps on the command queue when there is nothing to do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from workbench.engine.llm_engine import LLMEngine
from workbench.engine.outputs import RequestOutput
from workbench.serve.metrics import ServingMetrics
from workbench.serve.streams import DeltaTracker, RequestStream, StreamEvent, Usage

log = logging.getLogger("workbench.serve")
T = TypeVar("T")

# While idle the thread wakes this often to notice a stop request even if no command arrives.
IDLE_WAIT_S = 0.5
# After a step that emitted nothing (a dynamic batch waiting for its timer, a long prompt's middle chunk),
# wait this long for a command before stepping again, so the thread does not spin.
EMPTY_STEP_WAIT_S = 0.001
# The engine's recorder keeps every finished sequence and step record; a long-running server clears it
# once this many finished sequences have been exported to Prometheus.
DEFAULT_RETAIN_FINISHED = 100_000


class EngineStopped(RuntimeError):
    """The engine loop is not running (not started, shutting down, or failed)."""


class EngineLoop:
    def __init__(self, engine: LLMEngine, metrics: ServingMetrics, *,
                 retain_finished: int = DEFAULT_RETAIN_FINISHED):
        self.engine = engine
        self.metrics = metrics
        self.retain_finished = retain_finished
        self._commands: queue.Queue[tuple[Callable[[LLMEngine], Any], concurrent.futures.Future]] = queue.Queue()
        self._active: dict[str, DeltaTracker] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._draining = False  # shutting down: running requests may finish, new ones are refused
        self._finished_seen = 0  # engine.metrics.finished[:this] are exported
        self._times_seen: dict[int, int] = {}  # seq_id -> its token times already observed (TTFT, ITL)
        self._failed: set[str] = set()  # requests ended by an engine error (finished_reason "error")
        self._steps_seen = 0
        self._restored_done: dict[str, int] = {}  # finished requests' prompt tokens from a second KV tier
        metrics.attach_offload(getattr(engine, "kv_offload", None))
        prefix = engine.blocks.stats
        self._prefix_seen = (prefix.queried_tokens, prefix.hit_tokens)

    # ---------------------------------------------------------------------------- any thread / event loop
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the engine loop is already started")
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Abort what is still running, stop the thread and wait for it."""
        self._stopping.set()
        self._commands.put((lambda engine: None, concurrent.futures.Future()))  # wake an idle thread
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping.is_set()

    @property
    def draining(self) -> bool:
        """Shutting down: running requests may finish, new ones are refused."""
        return self._draining

    def call(self, fn: Callable[[LLMEngine], T]) -> concurrent.futures.Future[T]:
        """Run ``fn(engine)`` on the engine thread between steps; its result or exception lands in the future."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        if not self.alive:
            future.set_exception(EngineStopped("the engine is not running (the server is shutting down)"))
        else:
            self._commands.put((fn, future))
        return future

    async def run(self, fn: Callable[[LLMEngine], T]) -> T:
        return await asyncio.wrap_future(self.call(fn))

    async def add_request(self, request_id: str, admit: Callable[[LLMEngine], tuple[list[int], Any]],
                          num_choices: int, arrival_time: float) -> RequestStream:
        """Admit a request; ``admit(engine)`` returns its token ids and SamplingParams (or raises to refuse it)."""
        stream = RequestStream(request_id, asyncio.get_running_loop(), num_choices)

        def add(engine: LLMEngine) -> None:
            if self._draining:
                raise EngineStopped("the server is shutting down")
            prompt_ids, params = admit(engine)
            engine.add_request(prompt_ids, params, request_id=request_id, arrival_time=arrival_time, chat=False)
            stream.num_prompt_tokens = len(prompt_ids)
            wants = params.logprobs is not None or params.prompt_logprobs is not None
            token_text = (lambda token: engine.tokenizer.decode([token])) if wants else None
            self._active[request_id] = DeltaTracker(stream, num_choices, token_text)

        await self.run(add)
        return stream

    async def drain(self, grace_s: float) -> None:
        """Refuse new requests, give running ones ``grace_s`` seconds to finish, then abort the rest (their
        clients get finish_reason "abort" and a clean end of stream)."""
        self._draining = True
        deadline = time.monotonic() + grace_s
        while self._active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._active and self.alive:
            await self.run(lambda engine: [self._abort(rid, "abort") for rid in list(self._active)])

    def abort(self, request_id: str) -> None:
        """Stop a request (its client went away); fire and forget."""
        self.call(lambda engine: self._abort(request_id, "abort"))

    # ----------------------------------------------------------------------------------- engine thread
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                busy = self.engine.has_unfinished_requests()
                self._run_commands(wait=None if busy else IDLE_WAIT_S)
                if self._stopping.is_set():
                    break
                if self.engine.has_unfinished_requests():
                    self._step()
                else:
                    self._export_idle()
        finally:
            self._shutdown()

    def _run_commands(self, wait: float | None) -> None:
        """Run every queued command; with ``wait``, first block up to that long for one to arrive."""
        block = wait is not None
        while True:
            try:
                fn, future = self._commands.get(block=block, timeout=wait)
            except queue.Empty:
                return
            block = False
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(self.engine))
                except BaseException as exc:  # handed to the caller, who turns it into an HTTP error
                    future.set_exception(exc)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:
            log.exception("engine step failed; failing the requests in flight")
            for request_id in list(self._active):
                self._failed.add(request_id)
                self._abort(request_id, "abort", error=f"engine error: {type(exc).__name__}: {exc}")
            return
        cached = self._export_finished()
        self._export_progress()
        self._export_steps()
        self._dispatch(outputs, cached)
        if not outputs:
            self._run_commands(wait=EMPTY_STEP_WAIT_S)

    def _dispatch(self, outputs: list[RequestOutput], cached: dict[str, int]) -> None:
        for output in outputs:
            tracker = self._active.get(output.request_id)
            if tracker is None:  # a request added to this engine by someone else
                continue
            deltas = tracker.deltas(output)
            new_tokens = sum(d.num_tokens for d in deltas)
            prompt_tokens = cached_prompt = 0
            restored = 0
            if new_tokens and not tracker.counted_prompt:
                tracker.counted_prompt, prompt_tokens = True, len(output.prompt_ids)
                cached_prompt = cached.get(output.request_id, self._cached_prompt_tokens(output.request_id))
                restored = self._restored_prompt_tokens(output.request_id)
            self.metrics.record_tokens(prompt_tokens, new_tokens, cached_prompt, restored)
            usage = error = None
            if output.finished:
                del self._active[output.request_id]
                usage = Usage(len(output.prompt_ids), tracker.completion_tokens, cached.get(output.request_id, 0))
                error = next((c.error for c in output.outputs if c.error is not None), None)
            tracker.stream.push(StreamEvent(deltas, usage, error))

    def _abort(self, request_id: str, reason: str, error: str | None = None) -> None:
        tracker = self._active.pop(request_id, None)
        if request_id in self.engine.requests:
            self.engine.abort(request_id)
        cached = self._export_finished()
        if tracker is not None:
            usage = Usage(tracker.stream.num_prompt_tokens, tracker.completion_tokens, cached.get(request_id, 0))
            tracker.stream.push(StreamEvent(tracker.close_all(reason), None if error else usage, error))

    def _shutdown(self) -> None:
        """Runs on the engine thread as it exits: end every stream, refuse every queued command, and let the
        engine close (a write-back KV tier writes what it lacks)."""
        self._stopping.set()
        for request_id in list(self._active):
            try:
                self._abort(request_id, "abort")
            except Exception:  # keep ending the other streams
                log.exception("could not abort %s at shutdown", request_id)
        while True:
            try:
                _, future = self._commands.get_nowait()
            except queue.Empty:
                break
            if future.set_running_or_notify_cancel():
                future.set_exception(EngineStopped("the server is shutting down"))
        try:
            self.engine.close()
        except Exception:  # a tier that cannot write at exit must not keep the server from stopping
            log.exception("could not close the engine cleanly")

    # ------------------------------------------------------------------------------- metrics export
    def _export_finished(self) -> dict[str, int]:
        """Feed newly finished sequences to Prometheus; return their requests' cached prompt tokens."""
        finished = self.engine.metrics.finished
        if len(finished) < self._finished_seen:  # someone reset the recorder
            self._finished_seen = self._steps_seen = 0
        cached: dict[str, int] = {}
        for seq in finished[self._finished_seen:]:
            self.metrics.record_progress(seq, self._times_seen.pop(seq.seq_id, 0))
            self.metrics.record_finished(seq, error=seq.request_id in self._failed)
            self._failed.discard(seq.request_id)
            cached.setdefault(seq.request_id, seq.num_cached_prompt_tokens)
            tracker = self._active.get(seq.request_id)
            if tracker is not None and not tracker.counted_prompt and hasattr(self.engine.blocks, "restored_tokens"):
                self._restored_done.setdefault(seq.request_id, self.engine.blocks.restored_tokens(seq.seq_id))
        self._finished_seen = len(finished)
        return cached

    def _cached_prompt_tokens(self, request_id: str) -> int:
        """The prompt tokens a running request found in the prefix cache (its first sequence's last admission)."""
        request = self.engine.requests.get(request_id)
        return request.seqs[0].num_cached_prompt_tokens if request is not None and request.seqs else 0

    def _restored_prompt_tokens(self, request_id: str) -> int:
        """Of those, the ones restored from a second KV tier (0 without one)."""
        request, blocks = self.engine.requests.get(request_id), self.engine.blocks
        done = self._restored_done.pop(request_id, None)
        if done is not None or request is None or not request.seqs or not hasattr(blocks, "restored_tokens"):
            return done or 0
        return blocks.restored_tokens(request.seqs[0].seq_id)

    def _export_progress(self) -> None:
        """TTFT and ITL of the sequences still running, observed as their tokens are produced."""
        for request in self.engine.requests.values():
            for seq in request.seqs:
                if not seq.is_finished:
                    self._times_seen[seq.seq_id] = self.metrics.record_progress(seq,
                                                                                self._times_seen.get(seq.seq_id, 0))

    def _export_steps(self) -> None:
        steps = self.engine.metrics.steps
        new = steps[self._steps_seen:]
        self._steps_seen = len(steps)
        for record in new:
            self.metrics.record_step(record)
        if new:
            last = new[-1]
            self._export_scheduler(last.num_prefill_seqs + last.num_decode_seqs, last.num_waiting)

    def _export_idle(self) -> None:
        self._export_finished()
        self._export_scheduler(0, 0)
        if self._finished_seen > self.retain_finished and not self._active:
            self.engine.metrics.reset()  # everything in it is exported already
            self._finished_seen = self._steps_seen = 0

    def _export_scheduler(self, running: int, waiting: int) -> None:
        blocks = self.engine.blocks
        stats = blocks.stats
        queries, hits = stats.queried_tokens, stats.hit_tokens
        seen_queries, seen_hits = self._prefix_seen
        if queries < seen_queries or hits < seen_hits:  # someone reset the stats
            seen_queries = seen_hits = 0
        self._prefix_seen = (queries, hits)
        self.metrics.record_scheduler(running, waiting, blocks.usage, queries - seen_queries, hits - seen_hits)
        self.metrics.record_offload(self.engine.kv_offload)
