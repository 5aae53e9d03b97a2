"""lm-evaluation-harness (pinned 0.4.13, in its own ``.venv-lmeval`` that ``make test`` builds) scores the same
weights the same way through ``workbench serve`` as through its own ``hf`` backend.

Three tasks on data the project ships (``datasets/eval/lm_eval``, nothing from a hub): multiple choice (each
choice's log-likelihood: ``echo`` + ``logprobs`` on /v1/completions, as lm-eval's ``local-completions`` sends it),
rolling log-likelihood (whole passages' perplexity) and greedy generation. lm-eval runs them against a live server
with ``tokenized_requests`` on (prompts as token ids, batches of four: ``list[list[int]]``) and off (the text,
batches of four: ``list[str]``), and with its ``hf`` backend (transformers on the converted checkpoint in
``$WORKBENCH_CACHE``, fp32, CPU). Every sample's log-likelihood must agree within 1e-3, the accuracies and
greedy flags exactly, and the generations word for word. One lm-eval process runs all three (``lmeval_driver.py``),
so its imports are paid once. Without ``.venv-lmeval`` (its install failed, or only ``make setup`` ran) the test
skips and says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from serve_helpers import MODEL, make_engine, running_server, wait_idle

ROOT = Path(__file__).resolve().parents[2]
LMEVAL_PYTHON = ROOT / ".venv-lmeval" / "bin" / "python"
TOLERANCE = 1e-3  # nats per sample (fp32 on both sides)

pytestmark = [pytest.mark.external,
              pytest.mark.skipif(not (ROOT / ".venv-lmeval" / ".installed").exists(),
                                 reason="lm-eval is not installed in .venv-lmeval (`make test` or `make lm-eval` "
                                        "installs it)")]


def _runs(url: str, checkpoint: Path) -> list[dict]:
    server = (f"model={MODEL},base_url={url}/v1/completions,tokenizer={checkpoint},tokenizer_backend=huggingface,"
              "max_length=2048,max_retries=1,num_concurrent=1")
    return [{"name": "server_ids", "model": "local-completions", "batch_size": 4,
             "model_args": server + ",tokenized_requests=True"},
            {"name": "server_text", "model": "local-completions", "batch_size": 4,
             "model_args": server + ",tokenized_requests=False"},
            {"name": "hf", "model": "hf", "batch_size": 8,
             "model_args": f"pretrained={checkpoint},dtype=float32,device=cpu,max_length=2048"}]


@pytest.fixture(scope="module")
def scores(real_model, tokenizer, tmp_path_factory):
    checkpoint = Path(tokenizer.name_or_path)
    out = tmp_path_factory.mktemp("lm_eval")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(out / "datasets"), "TOKENIZERS_PARALLELISM": "false"}
    engine = make_engine(real_model, tokenizer)
    with running_server(engine) as server:
        (out / "runs.json").write_text(json.dumps(_runs(server.url, checkpoint)))
        start = time.perf_counter()
        done = subprocess.run([str(LMEVAL_PYTHON), "tests/lmeval_driver.py", str(out / "runs.json"),
                               str(out / "scores.json")], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=600)
        print(f"lm-eval: {time.perf_counter() - start:.1f} s;",
              " ".join(line for line in done.stderr.splitlines() if line.endswith(" s")))
        assert done.returncode == 0, done.stderr[-6000:]
        wait_idle(server)
        assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
    return json.loads((out / "scores.json").read_text())


def _loglikelihoods(run: dict, task: str) -> dict[str, list[tuple[float, bool | None]]]:
    """Per document: each request's (log-likelihood, is_greedy) (rolling tasks have no greedy flag)."""
    out = {}
    for doc, responses in run["samples"][task].items():
        out[doc] = [(r[0][0], r[0][1]) if isinstance(r[0], list) else (r[0], None) for r in responses]
    return out


@pytest.mark.parametrize("served", ["server_ids", "server_text"])
@pytest.mark.parametrize("task", ["workbench_mc", "workbench_rolling"])
def test_loglikelihoods_equal_lm_evals_hf_backend(scores, served, task):
    reference, got = _loglikelihoods(scores["hf"], task), _loglikelihoods(scores[served], task)
    assert reference.keys() == got.keys() and reference
    worst = 0.0
    for doc, expected in reference.items():
        assert len(got[doc]) == len(expected)
        for (ll, greedy), (want, want_greedy) in zip(got[doc], expected, strict=True):
            worst = max(worst, abs(ll - want))
            assert abs(ll - want) <= TOLERANCE, (doc, ll, want)
            assert greedy == want_greedy, (doc, ll, want)
    print(f"{task} via {served}: worst difference {worst:.2e} nats over {len(reference)} documents")


@pytest.mark.parametrize("served", ["server_ids", "server_text"])
def test_accuracy_perplexity_and_generations_are_the_same(scores, served):
    reference, got = scores["hf"]["metrics"], scores[served]["metrics"]
    for metric in ("acc,none", "acc_norm,none"):
        assert got["workbench_mc"][metric] == reference["workbench_mc"][metric]
    for metric in ("word_perplexity,none", "bits_per_byte,none"):
        assert got["workbench_rolling"][metric] == pytest.approx(reference["workbench_rolling"][metric], rel=1e-4)
    generations = scores["hf"]["samples"]["workbench_gen"]
    assert scores[served]["samples"]["workbench_gen"] == generations
    assert any(texts[0][0].strip() for texts in generations.values()), generations
