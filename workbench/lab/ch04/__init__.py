"""Chapter 4, prefill vs decode: where real engine steps sit under this device's roofline, what a decode step is
made of, TTFT against prompt length, a long prompt among decoders with and without chunked prefill, and streaming.

    steps.py             result objects of engine steps: RooflineSteps (with the chapter's Baseline), DecodeSweep
    runs.py              TTFT by prompt length (TTFTSweep); a long prompt among decoders per schedule (ScheduleSweep)
    streaming.py         one request streamed and unstreamed in alternating rounds (StreamRun)
    arithmetic.py        the book's numbers recomputed: decode floors, ridge batch and prompt length, streaming
    panels.py            RooflineLab, DecodeLab
    panels_timing.py     PrefillTTFTLab, ChunkedPrefillLab
    panels_streaming.py  StreamingLab
    ending.py            the exercises and the closing table
    on_gpu.py           the stored GPU measurement of this chapter beside this device's (on_gpu)
"""

from workbench.lab.kit.lazy import NOTEBOOK_NAMES, lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **NOTEBOOK_NAMES,
    "RooflineSteps": "steps", "DecodeSweep": "steps", "roofline_steps": "steps", "decode_sweep": "steps",
    "TTFTSweep": "runs", "ScheduleSweep": "runs", "ScheduleRun": "runs", "ttft_sweep": "runs",
    "schedule_sweep": "runs", "NO_CHUNKING": "runs", "STATIC": "runs", "ARRIVALS": "runs",
    "StreamRun": "streaming", "stream_vs_buffered": "streaming",
    "decode_floor_ms": "arithmetic", "seed_decode_claims": "arithmetic", "streaming_arithmetic": "arithmetic",
    "ridge_batch": "arithmetic", "ridge_prompt_length": "arithmetic",
    "RooflineLab": "panels", "DecodeLab": "panels",
    "PrefillTTFTLab": "panels_timing", "ChunkedPrefillLab": "panels_timing",
    "StreamingLab": "panels_streaming",
    "exercises": "ending", "closing_table": "ending", "timing_baseline": "ending",
    "implied_bandwidth_reading": "arithmetic", "seed_claims": "seed",
    "on_gpu": "on_gpu",
})
