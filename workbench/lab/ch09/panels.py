"""Chapter 9's panels: the routing policies side by side (per-replica hit rate and load, TTFT), the number of
tenants against what the replicas' caches hold, and a replica killed mid-run."""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.fleet.compare import OUTCOMES
from workbench.fleet.launcher import Fleet
from workbench.lab.ch09.runs import (
    CONCURRENCY,
    SWEEP_POLICIES,
    SWEEP_TENANTS,
    TENANTS,
    USERS,
    compare_policies,
    failure_run,
    fleet_label,
    outcome_table,
    policy_table,
    pool_tenants,
    replica_table,
    seconds_per_request,
    sweep_estimate_s,
    tenant_sweep,
)
from workbench.lab.kit.figures import style
from workbench.lab.kit.panel import LabPanel

POLICY_COLORS = {"round_robin": "#7f7f7f", "cache_aware": "#2ca02c", "power_of_two": "#1f77b4", "random": "#ff7f0e"}
REPLICA_COLORS = ["#9467bd", "#17becf", "#bcbd22", "#e377c2"]
OUTCOME_COLORS = dict(zip(OUTCOMES, ["#2ca02c", "#ff7f0e", "#d62728", "#8c564b"], strict=True))


class PolicyLab(LabPanel):
    """The tenant workload through round_robin, cache_aware and power_of_two: each replica's prefix-cache hit
    rate and requests (from its /metrics), the clients' TTFT."""

    def __init__(self, fleet: Fleet, *, tenants: int = TENANTS, users: int = USERS, concurrency: int = CONCURRENCY):
        self.fleet, self.subtitle = fleet, fleet_label(fleet)
        self.tenants = widgets.IntSlider(value=tenants, min=1, max=12, description="tenants")
        self.users = widgets.IntSlider(value=users, min=1, max=8, description="users/tenant")
        self.concurrency = widgets.IntSlider(value=concurrency, min=1, max=8, description="clients")
        super().__init__([self.tenants, self.users, self.concurrency], [go.Figure(), go.Figure()])

    def measure(self):
        return compare_policies(self.fleet, tenants=self.tenants.value, users_per_tenant=self.users.value,
                                concurrency=self.concurrency.value, progress=self.progress)

    def draw(self) -> None:
        runs, (hits, ttft) = self.result, self.figures
        policies = list(runs)
        with hits.batch_update():
            hits.data = []
            for i in range(self.fleet.size):
                rows = [run.replicas.iloc[i] for run in runs.values()]
                hits.add_bar(name=f"replica {i}", x=policies, y=[r["hit_rate"] for r in rows],
                             text=[f"{int(r['requests'])} req" for r in rows], textposition="outside",
                             marker_color=REPLICA_COLORS[i % len(REPLICA_COLORS)])
            hits.add_scatter(name="fleet", x=policies, y=[run.hit_rate for run in runs.values()], mode="markers",
                             marker={"symbol": "diamond", "size": 14, "color": "black"})
            hits.update_layout(barmode="group", yaxis={"title": "prefix-cache hit rate (tokens)", "range": [0, 1]})
            style(hits, f"Hit rate per replica, {self.tenants.value} tenants x {self.users.value} users "
                        "(bar labels: requests each replica served)", self.subtitle)
        with ttft.batch_update():
            ttft.data = []
            labels = [f"{p} (n={run.n})" for p, run in runs.items()]
            ttft.add_bar(name="TTFT p50", x=labels, y=[run.ttft_p50_ms for run in runs.values()],
                         marker_color=[POLICY_COLORS.get(p, "#333") for p in policies])
            ttft.add_bar(name="TTFT p90", x=labels, y=[run.ttft_p90_ms for run in runs.values()],
                         marker_color=[POLICY_COLORS.get(p, "#333") for p in policies], opacity=0.45)
            ttft.update_layout(barmode="group", yaxis_title="time to first token (ms), as the clients saw it")
            style(ttft, f"TTFT through the router, {self.concurrency.value} clients in a closed loop", self.subtitle,
                  height=380)
        parts = [f"{p} {run.hit_rate:.0%} hit, TTFT p50 {run.ttft_p50_ms:.0f} ms, {run.throughput:.2f} req/s"
                 for p, run in runs.items()]
        n = {run.n for run in runs.values()}
        self.status.value = (f"Per policy ({'/'.join(map(str, sorted(n)))} requests each): " + "; ".join(parts) + ".")

    def stored_tables(self):
        return [("per policy", policy_table(self.result)),
                ("per replica (from each replica's own /metrics, before and after the run)",
                 replica_table(self.result))]


class TenantsLab(LabPanel):
    """Hit rate and TTFT against the number of tenants, per policy, beside what one replica's pool and the
    fleet's pools hold. The sweep runs on its button (the label says how long it should take)."""

    def __init__(self, fleet: Fleet, *, reuse=None, tenants: tuple[int, ...] = SWEEP_TENANTS, users: int = USERS):
        self.fleet, self.subtitle, self.reuse = fleet, fleet_label(fleet), reuse or {}
        self.tenants = widgets.SelectMultiple(options=list(range(1, 13)), value=list(tenants), rows=4,
                                              description="tenants")
        self.users = widgets.IntSlider(value=users, min=1, max=8, description="users/tenant")
        self.estimate = widgets.HTML()
        self.button = widgets.Button(description="run the sweep")
        self.button.on_click(lambda _b: self.run())
        for control in (self.tenants, self.users):
            control.observe(lambda _c: self._estimate(), names="value")
        self._estimate()
        super().__init__([], [go.Figure(), go.Figure()],
                         rows=[widgets.HBox([self.tenants, self.users, self.button, self.estimate])])

    def _estimate(self) -> None:
        per_request = seconds_per_request(self.reuse) if self.reuse else 0.25
        seconds = sweep_estimate_s(tuple(self.tenants.value), SWEEP_POLICIES, self.users.value, per_request)
        self.estimate.value = f"about {seconds:.0f} s on this fleet"

    def measure(self):
        return tenant_sweep(self.fleet, tuple(sorted(self.tenants.value)), users_per_tenant=self.users.value,
                            reuse=self.reuse, progress=self.progress)

    @property
    def pool_holds(self) -> float:
        """Tenants' prompts one replica's KV pool holds, from the sweep's measured prompt length."""
        return pool_tenants(self.fleet, float(self.result["prompt_tokens"].mean()))

    def draw(self) -> None:
        sweep, (hits, ttft) = self.result, self.figures
        top = max(sweep["tenants"].max(), self.pool_holds * self.fleet.size) + 1
        for fig, column, title in ((hits, "hit_rate", "prefix-cache hit rate (tokens)"),
                                   (ttft, "ttft_p50_ms", "TTFT p50 (ms)")):
            with fig.batch_update():
                fig.data = []
                for policy, rows in sweep.groupby("policy", sort=False):
                    fig.add_scatter(name=f"{policy} {column}", x=rows["tenants"], y=rows[column],
                                    mode="lines+markers", line={"color": POLICY_COLORS.get(policy, "#333")})
                fig.update_layout(xaxis={"title": "tenants (each its own system prompt)", "range": [0, top]},
                                  yaxis_title=title)
        holds = self.pool_holds
        with hits.batch_update():
            for name, x in (("one replica's pool holds", holds), ("the fleet's pools hold", holds * self.fleet.size)):
                hits.add_scatter(name=name, x=[x, x], y=[0, 1], mode="lines", line={"dash": "dot", "color": "#999"})
            hits.update_layout(yaxis={"range": [0, 1]})
            style(hits, f"Tenants vs replicas: hit rate, {self.users.value} requests per tenant", self.subtitle)
        style(ttft, "Tenants vs replicas: TTFT p50", self.subtitle, height=360)
        last = sweep[sweep["tenants"] == sweep["tenants"].max()].set_index("policy")
        self.status.value = (f"One replica's pool holds about {holds:.1f} tenants' prompts while idle (running "
                             "requests hold blocks too, so fewer while busy), the fleet's "
                             f"{holds * self.fleet.size:.1f}. At {int(sweep['tenants'].max())} tenants: "
                             + "; ".join(f"{p} {row['hit_rate']:.0%} hit, {row['misses_per_tenant']:.1f} misses "
                                         f"per tenant" for p, row in last.iterrows()) + ".")

    def stored_tables(self):
        columns = ["policy", "tenants", "n", "hit_rate", "misses_per_tenant", "ttft_p50_ms", "ttft_p90_ms",
                   "req_per_s", "busiest_share"]
        return [("per policy and number of tenants", self.result[columns])]


class FailureLab(LabPanel):
    """Requests through the router while one replica is killed with SIGKILL: how each ended, and what the router
    did (its own counters). A dead replica is restarted before a re-run (that takes ~15 s more)."""

    def __init__(self, fleet: Fleet, *, policy: str = "cache_aware", kill_at_s: float = 2.0):
        self.fleet, self.subtitle = fleet, fleet_label(fleet)
        self.policy = widgets.Dropdown(options=list(POLICY_COLORS), value=policy, description="policy")
        self.retries = widgets.Checkbox(value=True, description="router retries")
        self.kill_at = widgets.FloatSlider(value=kill_at_s, min=0.5, max=4.0, step=0.5, description="kill at (s)")
        super().__init__([self.policy, self.retries, self.kill_at], [go.Figure()])

    def measure(self):
        return failure_run(self.fleet, policy=self.policy.value, retries=self.retries.value,
                           kill_at_s=self.kill_at.value, progress=self.progress)

    def draw(self) -> None:
        run, (fig,) = self.result, self.figures
        frame = run.requests.sort_values("start_s").reset_index(drop=True)
        with fig.batch_update():
            fig.data = []
            for outcome in OUTCOMES:
                rows = frame[frame["outcome"] == outcome]
                xs, ys = [], []
                for i, row in rows.iterrows():
                    xs += [row["start_s"], row["end_s"], None]
                    ys += [i, i, None]
                fig.add_scatter(name=outcome, x=xs, y=ys, mode="lines",
                                line={"width": 7, "color": OUTCOME_COLORS[outcome]})
            fig.add_scatter(name="replica killed", x=[run.kill_s, run.kill_s], y=[-1, len(frame)], mode="lines",
                            line={"dash": "dash", "color": "black"})
            fig.update_layout(xaxis_title="seconds since the first request", yaxis_title="request (in order sent)")
            style(fig, f"Replica {run.killed} killed mid-run: {run.policy}, router retries "
                       f"{'on' if run.retries_enabled else 'off'}", self.subtitle, height=380)
        c, r = run.counts, run.router
        self.status.value = (f"{len(frame)} requests: {c['completed']} completed, {c['cut mid-stream']} cut "
                             f"mid-stream, {c['refused']} refused, {c['failed before any token']} failed before any "
                             f"token; the router retried {r['retries']:.0f} time(s); longest request "
                             f"{run.longest_s:.1f} s, every one ended: {run.all_finished}.")

    def stored_tables(self):
        return [("requests by when they were sent and how they ended", outcome_table(self.result))]
