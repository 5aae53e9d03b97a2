"""Chapter 11's panels: restore against recompute by prefix length on this machine (and the same question on the
stored GPUs), hit rate against working-set size with one tier and two, sessions that come back with and without a
tier, and a server restarted on a disk tier."""

from __future__ import annotations

import tempfile

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go

from workbench.lab.ch11.restart import restart_run
from workbench.lab.ch11.runs import GpuCase, crossover_frame, measure_tiers
from workbench.lab.ch11.sessions import engine_check, multi_turn, stream
from workbench.lab.ch11.tier_sim import working_set_sweep
from workbench.lab.kit.figures import style
from workbench.lab.kit.notebook import measured_on
from workbench.lab.kit.panel import LabPanel

TIER_COLORS = {"host memory": "#1f77b4", "disk, page cache": "#2ca02c", "disk, cold": "#8c564b"}
ARM_COLORS = {"no tier": "#d62728", "host tier": "#1f77b4", "disk tier": "#2ca02c"}
RECOMPUTE = "recompute (prefill)"


def _when(tokens: float) -> str:
    return "never within 32K tokens" if not np.isfinite(tokens) else f"from {tokens:,.0f} tokens on"


class CrossoverLab(LabPanel):
    """Time to put an L-token prefix's KV in the device cache: restored from each tier, or recomputed."""

    def __init__(self, model):
        self.model, self.subtitle = model, measured_on(model)
        self.kv_format = widgets.Dropdown(options=["auto", "int8", "int4"], value="auto", description="KV format")
        super().__init__([self.kv_format], [go.Figure(), go.Figure()])

    def measure(self):
        return measure_tiers(self.model, kv_format=self.kv_format.value, progress=self.progress)

    def draw(self) -> None:
        costs, (lines, rates) = self.result, self.figures
        frame = crossover_frame(costs)
        with lines.batch_update():
            lines.data = []
            lines.add_scatter(name=RECOMPUTE, x=frame["tokens"], y=frame["recompute_ms"], mode="lines",
                              line={"color": "#d62728", "width": 3})
            lines.add_scatter(name="whole prefill steps measured (their fixed cost included)",
                              x=costs.prefill["context"], y=costs.prefill["step_s"] * 1e3, mode="markers",
                              marker={"color": "#d62728", "symbol": "x", "size": 10})
            for tier in costs.restore:
                lines.add_scatter(name=f"restore from {tier}", x=frame["tokens"], y=frame[f"{tier}_ms"], mode="lines",
                                  line={"color": TIER_COLORS[tier]})
            lines.update_layout(xaxis={"title": "prefix length (tokens)", "type": "log"},
                                yaxis={"title": "ms to have the prefix's KV in the device cache", "type": "log"})
            style(lines, f"Restore or recompute a prefix, KV {costs.kv_format}", self.subtitle)
        table = costs.table()
        with rates.batch_update():
            rates.data = []
            rates.add_bar(name="GB/s a block arrives at", x=table["tier"], y=table["GB/s"],
                          text=[f"{v:.3g}" for v in table["GB/s"]], textposition="outside",
                          marker_color=[TIER_COLORS.get(t, "#d62728") for t in table["tier"]])
            rates.update_layout(yaxis={"title": "bytes of KV per second into the device cache (GB/s)", "type": "log"})
            style(rates, "Each way of getting a block back, as a bandwidth", self.subtitle, height=360)
        parts = [f"from {tier} {_when(costs.crossover_tokens(tier))} ({costs.speedup(tier, 512):,.0f}x faster at "
                 "512 tokens)" for tier in costs.restore]
        self.status.value = (f"Recomputing costs {costs.per_token_s * 1e3:.2f} ms per token here. Restoring beats it "
                             + "; ".join(parts) + ".")

    def stored_tables(self):
        return [("each tier's measured cost (and recompute's)", self.result.table()),
                ("prefill steps timed", self.result.prefill)]


def gpu_figure(cases: list[GpuCase], longest: int = 8192) -> go.Figure:
    """Restore over the host link, at HBM speed, and recompute, for Llama-3-8B on each stored GPU."""
    fig = go.Figure()
    tokens = np.arange(16, longest + 1, 16)
    colors = ["#1f77b4", "#9467bd"]
    for case, color in zip(cases, colors, strict=False):
        short = case.device.replace("NVIDIA ", "")
        fig.add_scatter(name=f"{short}: recompute", x=tokens, y=case.recompute_s(tokens) * 1e3, mode="lines",
                        line={"color": color, "width": 3})
        fig.add_scatter(name=f"{short}: prefill steps measured", x=case.prefill["context"],
                        y=case.prefill["step_s"] * 1e3, mode="markers", marker={"color": color, "symbol": "x"})
        link = "host link measured" if case.host_measured else "PCIe 5.0 x16 datasheet (not measured)"
        fig.add_scatter(name=f"{short}: restore over the {link}", x=tokens,
                        y=case.restore_s(tokens, case.host_bytes_per_s) * 1e3, mode="lines",
                        line={"color": color, "dash": "solid" if case.host_measured else "dash"})
        fig.add_scatter(name=f"{short}: restore at its measured HBM copy speed", x=tokens,
                        y=case.restore_s(tokens, case.hbm_bytes_per_s) * 1e3, mode="lines",
                        line={"color": color, "dash": "dot"})
    fig.update_layout(xaxis={"title": "prefix length (tokens)", "type": "log"},
                      yaxis={"title": "ms to have the prefix's KV on the GPU", "type": "log"})
    sources = "; ".join(c.source for c in cases)
    return style(fig, "The GPU case: Llama-3-8B, bf16, random weights", f"stored measurements: {sources}", height=480)


class HitRateLab(LabPanel):
    """Hit rate against the number of sessions cycling through the cache, device alone and with a tier (the
    simulator), and the engine's count on one stream beside it."""

    def __init__(self, model, *, device_blocks: int = 10, tier_blocks: int = 24, check_sessions: int = 4):
        self.model, self.subtitle = model, measured_on(model)
        self.device_blocks = widgets.IntSlider(value=device_blocks, min=6, max=40, description="device blocks")
        self.tier_blocks = widgets.IntSlider(value=tier_blocks, min=4, max=80, step=4, description="tier blocks")
        self.check_sessions = check_sessions
        super().__init__([self.device_blocks, self.tier_blocks], [go.Figure()])

    def measure(self):
        device, tier = self.device_blocks.value, self.tier_blocks.value
        sweep = working_set_sweep(lambda n: stream(n, 6 * n), range(1, 13), device, tier, 16)
        check = engine_check(self.model, sessions=self.check_sessions, device_blocks=device, tier_blocks=tier)
        return sweep, check

    def draw(self) -> None:
        (sweep, check), (fig,) = self.result, self.figures
        with fig.batch_update():
            fig.data = []
            for column, color in (("device only", "#d62728"), ("device + tier", "#1f77b4")):
                fig.add_scatter(name=f"simulated: {column}", x=sweep["sessions"], y=sweep[column], mode="lines+markers",
                                line={"color": color})
                queried, hits, restored = check.engine[column]
                fig.add_scatter(name=f"engine: {column}", x=[check.sessions], y=[(hits + restored) / queried],
                                mode="markers", marker={"color": color, "symbol": "diamond-open", "size": 16})
            fig.update_layout(xaxis_title="sessions cycling (round robin, 4 blocks of history each)",
                              yaxis={"title": "prompt tokens not recomputed", "tickformat": ".0%"})
            style(fig, f"{check.device_blocks} device blocks, with and without {check.tier_blocks} tier blocks",
                  self.subtitle, height=400)
        self.status.value = self.reading()

    def reading(self) -> str:
        sweep, check = self.result
        alone = sweep[sweep["device only"] > 0]["sessions"].max()
        tiered = sweep[sweep["device + tier"] > 0]["sessions"].max()
        agree = "equal to" if check.matches else "DIFFERENT from"
        return (f"Alone, the device keeps sessions returning up to {alone} sessions; with the tier, up to {tiered}. "
                f"At {check.sessions} sessions the engine's counts are {agree} the simulator's "
                f"(device only {check.engine['device only'][1] + check.engine['device only'][2]} tokens not "
                f"recomputed, with the tier {sum(check.engine['device + tier'][1:])}, of "
                f"{check.engine['device only'][0]}).")

    def stored_tables(self):
        return [("simulated hit rates by working set", self.result[0])]


class SessionsLab(LabPanel):
    """Sessions returning after the others evicted them: TTFT of every turn, without a tier and with one."""

    def __init__(self, model, *, sessions: int = 4, turns: int = 3, history: int = 256, repeats: int = 2):
        self.model, self.subtitle = model, measured_on(model)
        self.sessions = widgets.IntSlider(value=sessions, min=3, max=8, description="sessions")
        self.tier = widgets.Dropdown(options=["host tier", "disk tier"], value="host tier", description="tier")
        self.turns, self.history, self.repeats = turns, history, repeats
        super().__init__([self.sessions, self.tier], [go.Figure()])

    def measure(self):
        return multi_turn(self.model, sessions=self.sessions.value, turns=self.turns, history=self.history,
                          arms=("no tier", self.tier.value), repeats=self.repeats, progress=self.progress)

    def draw(self) -> None:
        run, (fig,) = self.result, self.figures
        frame = run.frame
        with fig.batch_update():
            fig.data = []
            for arm in frame["arm"].unique():
                rows = frame[frame["arm"] == arm]
                fig.add_scatter(name=arm, x=[f"turn {t}, session {s}" for t, s in zip(rows["turn"], rows["session"],
                                                                                       strict=True)],
                                y=rows["ttft_ms"], mode="markers", marker={"color": ARM_COLORS[arm], "size": 9},
                                text=[f"run {r}" for r in rows["run"]])
            fig.update_layout(yaxis={"title": "TTFT (ms)", "type": "log"}, xaxis_title="request, in order")
            style(fig, f"{self.sessions.value} sessions of {self.turns} turns, one device pool of "
                       f"{run.device_blocks} blocks", self.subtitle, height=420)
        arm = run.tier_arms[0]
        self.status.value = (f"Returning turns: median TTFT {run.returns('no tier').median():,.0f} ms without a tier, "
                             f"{run.returns(arm).median():,.0f} ms with the {arm} ({run.ratio(arm):.1f}x), over "
                             f"{len(run.returns(arm))} returning requests per arm in {self.repeats} alternating runs; "
                             f"greedy answers {'identical' if run.outputs_identical else 'NOT identical'} in every "
                             "run.")

    def stored_tables(self):
        return [("returning turns, per arm and run", self.result.summary())]


class RestartLab(LabPanel):
    """A server on a disk tier answers a long prompt and stops; a new one on the same directory answers it again."""

    def __init__(self, model, tokenizer, *, prompt_tokens: int = 512):
        self.model, self.tokenizer, self.subtitle = model, tokenizer, measured_on(model)
        self.prompt_tokens = widgets.Dropdown(options=[256, 512, 1024], value=prompt_tokens, description="prompt")
        super().__init__([self.prompt_tokens], [go.Figure()])

    def measure(self):
        with tempfile.TemporaryDirectory(prefix="ch11-restart-") as folder:
            return restart_run(self.model, self.tokenizer, folder, prompt_tokens=self.prompt_tokens.value)

    def draw(self) -> None:
        run, (fig,) = self.result, self.figures
        with fig.batch_update():
            fig.data = []
            fig.add_bar(name="time to first token", x=run.frame["server"], y=run.frame["ttft_ms"],
                        text=[f"{c} cached" for c in run.frame["cached_tokens"]], textposition="outside",
                        marker_color=["#d62728", "#2ca02c"])
            fig.update_layout(yaxis_title="ms, as the client sees it (1 token)")
            style(fig, f"The same {self.prompt_tokens.value}-token prompt, before and after a restart", self.subtitle,
                  height=360)
        self.status.value = (f"The restarted server read {run.usage['prompt_tokens_details']['cached_tokens']} of "
                             f"{run.usage['prompt_tokens']} prompt tokens from {run.files} block files and answered "
                             f"{run.speedup:.1f}x sooner; a server with int8 KV on the same directory found "
                             f"{run.foreign_found} of them usable (its own folder: {len(run.folders)} folders now).")

    def stored_tables(self):
        return [("before and after", self.result.frame)]
