"""The server chapter 8 watches: our OpenAI-compatible server on a 2-layer random-weight model of SmolLM2's shapes,
started in a background thread and always stopped (`serve`), and the Grafana dashboard's expressions checked
against what it exports (`grafana_check`). No widgets here."""

from __future__ import annotations

import atexit
import json
import re
import socket
from functools import cache
from pathlib import Path

import httpx
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from workbench.config import CacheConfig, SchedulerConfig
from workbench.engine.llm_engine import LLMEngine
from workbench.models import model_spec, random_model
from workbench.serve.launch import ServerThread

DASHBOARD = Path(__file__).resolve().parents[3] / "datasets" / "grafana" / "kv_workbench_serving.json"
SERVED_NAME = "tiny-smollm2"


@cache
def serving_model():
    """SmolLM2's shapes and full vocabulary with 2 layers and random weights: a step takes milliseconds on a CPU,
    so a 10 s load with a fault in it fits the notebook's time budget. What the metrics show does not depend on
    the weights (the load ignores end-of-sequence)."""
    spec = model_spec("smollm2-135m").replace(name="smollm2-shapes-2-layers", num_layers=2, intermediate_size=256)
    return random_model(spec, device="cpu", seed=5)


class BackgroundServer:
    """Our OpenAI-compatible server on 127.0.0.1 (a free port) in a background thread; ``stop()`` is idempotent
    and also runs at interpreter exit, so the port is released even if the notebook fails half-way."""

    def __init__(self, engine: LLMEngine, model_name: str):
        self.thread = ServerThread(engine, model_name=model_name)
        self.host, self.port, self.url = self.thread.host, self.thread.port, self.thread.url
        self.stopped = False
        self.thread.start()
        atexit.register(self.stop)

    @property
    def engine_loop(self):
        return self.thread.engine_loop

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.thread.stop()

    def port_open(self) -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex((self.host, self.port)) == 0

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(tokenizer, *, num_blocks: int = 256) -> BackgroundServer:
    engine = LLMEngine(serving_model(), tokenizer, cache_config=CacheConfig(num_blocks=num_blocks),
                       scheduler_config=SchedulerConfig())
    return BackgroundServer(engine, SERVED_NAME)


def grafana_check(url: str) -> pd.DataFrame:
    """Each panel of the Grafana dashboard, the metric names its expressions use, and whether the server at
    ``url`` exports every one of them."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    exported = {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    rows = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        names = sorted({n for t in panel["targets"] for n in re.findall(r"vllm:[A-Za-z0-9_:]+", t["expr"])})
        rows.append({"panel": panel["title"], "metrics": ", ".join(names),
                     "all exported": all(n in exported for n in names)})
    return pd.DataFrame(rows)
