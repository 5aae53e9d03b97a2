"""``python -m workbench.fleet``: the routing policies side by side on one fleet, one run each of the same
multi-tenant workload; prints a table and a final JSON line (the benchmarks' convention).

    python -m workbench.fleet --replicas 2 --tenants 6 --users 4 --policies round_robin,cache_aware,power_of_two
"""

from __future__ import annotations

import argparse
import json
import time

from workbench.fleet.compare import run_policy
from workbench.fleet.launcher import Fleet
from workbench.fleet.replica import ReplicaOptions
from workbench.fleet.router import COMPARED, POLICIES, router_version


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workbench.fleet", description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--num-blocks", type=int, default=64, help="KV blocks of 16 tokens per replica")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--tenants", type=int, default=6)
    parser.add_argument("--users", type=int, default=4, help="requests per tenant")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--policies", default=",".join(COMPARED),
                        help=f"comma-separated, from {', '.join(POLICIES)}")
    parser.add_argument("--repeats", type=int, default=1, help="runs per policy, interleaved")
    args = parser.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    options = ReplicaOptions(num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs)
    began = time.monotonic()
    rows = []
    with Fleet(args.replicas, policy=policies[0], options=options) as fleet:
        print(fleet.describe())
        run = 0
        for repeat in range(args.repeats):
            for policy in policies:
                run += 1
                result = run_policy(fleet, policy, tenants=args.tenants, users_per_tenant=args.users,
                                    concurrency=args.concurrency, max_tokens=args.max_tokens, run=run, seed=repeat)
                rows.append({**result.row(), "repeat": repeat,
                             "replica_hit_rates": [round(x, 3) for x in result.replicas["hit_rate"].fillna(0)],
                             "replica_requests": [int(x) for x in result.replicas["requests"]]})
    header = f"{'policy':<14}{'n':>4}{'hit rate':>10}{'TTFT p50':>10}{'TTFT p90':>10}{'req/s':>8}  per replica"
    print(header)
    for r in rows:
        print(f"{r['policy']:<14}{r['n']:>4}{r['hit_rate']:>10.2f}{r['ttft_p50_ms']:>8.0f}ms{r['ttft_p90_ms']:>8.0f}ms"
              f"{r['req_per_s']:>8.2f}  requests {r['replica_requests']}, hit {r['replica_hit_rates']}")
    print(json.dumps({"router": f"vllm-router {router_version()}", "replicas": args.replicas,
                      "num_blocks": args.num_blocks, "tenants": args.tenants, "users": args.users,
                      "concurrency": args.concurrency, "seconds": round(time.monotonic() - began, 1),
                      "runs": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]}))


if __name__ == "__main__":
    main()
