"""Runs lm-evaluation-harness (in its own venv, ``.venv-lmeval``) for tests/serve/test_lm_eval.py: several backends, one
process, so lm-eval and its dependencies are imported once.

    .venv-lmeval/bin/python tests/lmeval_driver.py RUNS.json OUT.json

RUNS.json: ``[{"name", "model", "model_args", "batch_size"}, ...]``; the tasks are the YAML files in
datasets/eval/lm_eval (run from the repository root: their data paths are relative to it). OUT.json: per run, each
task's metrics and each sample's responses (log-likelihoods, greedy flags, generations), by document id.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

TASKS = ["workbench_mc", "workbench_rolling", "workbench_gen"]
TASK_DIR = Path("datasets/eval/lm_eval")


def _plain(value):
    """JSON-safe: tuples to lists, numbers as floats, anything else as its string."""
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value)


def run(spec: dict) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    start = time.perf_counter()
    results = simple_evaluate(model=spec["model"], model_args=spec["model_args"], tasks=TASKS,
                              task_manager=TaskManager(include_path=str(TASK_DIR)),
                              batch_size=spec.get("batch_size", 1), log_samples=True, bootstrap_iters=0)
    print(f"{spec['name']}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    samples = {task: {str(s["doc_id"]): _plain(s["resps"]) for s in rows}
               for task, rows in results["samples"].items()}
    return {"metrics": _plain(results["results"]), "samples": samples}


def main() -> None:
    runs = json.loads(Path(sys.argv[1]).read_text())
    out = {spec["name"]: run(spec) for spec in runs}
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
