"""Scraping a Prometheus text endpoint (this workbench's server, vLLM's, SGLang's, anyone's) into pandas.

    with MetricsScraper("http://127.0.0.1:8000", interval_s=0.5) as scraper:
        ...drive load...
    samples = scraper.frame()       # one row per sample per scrape: time, name, le, labels, value

Parsing is prometheus-client's own (``text_string_to_metric_families``), so every exposition Prometheus accepts
reads here. What Prometheus does next (rates, histogram quantiles) is in `workbench.monitoring.promql`, which
works on the long frame this module returns. Times are ``time.time()`` seconds at the moment each scrape's
response arrived, one timestamp for all the samples of a scrape, as Prometheus stamps a scrape.
"""

from __future__ import annotations

import math
import threading
import time

import httpx
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

COLUMNS = ("time", "name", "le", "labels", "value")


def label_key(labels: dict[str, str]) -> str:
    """A series' labels except ``le``, as one sortable string (``a="1",b="x"``)."""
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "le")


def parse_exposition(text: str, at: float) -> list[tuple]:
    """Rows ``(time, sample name, le, labels, value)`` for every sample of one exposition text."""
    rows = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            le = float(sample.labels["le"]) if "le" in sample.labels else math.nan
            rows.append((at, sample.name, le, label_key(sample.labels), float(sample.value)))
    return rows


def samples_frame(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(COLUMNS))


class MetricsScraper:
    """Scrapes ``<url>/metrics`` (or ``url`` itself if it ends in ``/metrics``) every ``interval_s`` seconds
    in a background thread, keeping every sample. ``scrape_once()`` scrapes now, from the calling thread."""

    def __init__(self, url: str, *, interval_s: float = 1.0, timeout_s: float = 5.0, headers: dict | None = None,
                 max_scrapes: int = 100_000):
        if not (isinstance(interval_s, int | float) and 0.01 <= interval_s <= 3600):
            raise ValueError(f"interval_s must be a number of seconds in [0.01, 3600], got {interval_s!r}")
        self.url = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
        self.interval_s, self.max_scrapes = float(interval_s), max_scrapes
        self._client = httpx.Client(timeout=timeout_s, headers=headers or {})
        self._rows: list[tuple] = []
        self._times: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []  # failed scrapes (the endpoint down, say): kept, not raised, as Prometheus does

    def scrape_once(self) -> float:
        """One scrape; returns its timestamp. Raises on an HTTP error or an exposition that does not parse."""
        response = self._client.get(self.url)
        response.raise_for_status()
        at = time.time()
        rows = parse_exposition(response.text, at)
        with self._lock:
            self._rows.extend(rows)
            self._times.append(at)
        return at

    def _loop(self) -> None:
        while not self._stop.is_set() and len(self._times) < self.max_scrapes:
            began = time.monotonic()
            try:
                self.scrape_once()
            except (httpx.HTTPError, ValueError) as error:
                self.errors.append(f"{time.time():.3f}: {error!r}")
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def start(self) -> MetricsScraper:
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("this scraper is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="metrics-scraper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 10)
        self._thread = None

    def close(self) -> None:
        self.stop()
        self._client.close()

    def __enter__(self) -> MetricsScraper:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def scrape_times(self) -> list[float]:
        with self._lock:
            return list(self._times)

    def frame(self) -> pd.DataFrame:
        """Every sample scraped so far, one row per sample per scrape (columns: time, name, le, labels, value)."""
        with self._lock:
            return samples_frame(list(self._rows))
