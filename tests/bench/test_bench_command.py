"""``workbench bench`` on the command line: the one-command local run (it starts and stops its own server),
the summary and final JSON line it prints, the rows it saves, and one-line errors for bad options."""

from __future__ import annotations

import json

import pandas as pd

from workbench.cli import main


def test_start_server_runs_the_whole_benchmark(tmp_path, capsys):
    rows_path = tmp_path / "rows.csv"
    status = main(["bench", "--start-server", "--server-args=--num-blocks 64 --max-num-seqs 4",
                   "--random", "3", "--input-tokens", "4:8", "--output-tokens", "2:4", "--concurrency", "2",
                   "--slo", "ttft=600000", "--output", str(rows_path), "--no-progress"])
    out = capsys.readouterr().out
    assert status == 0, out
    final = json.loads(out.strip().splitlines()[-1])
    assert final["summary"]["completed"] == 3 and final["summary"]["failed"] == 0
    assert final["summary"]["good_requests"] == 3
    assert final["config"]["load"] == "closed loop, concurrency 2"
    assert "ttft" in out and "p99" in out and "goodput" in out
    rows = pd.read_csv(rows_path)
    assert len(rows) == 3 and rows["success"].all() and (rows["output_tokens"] >= 2).all()


def test_bad_options_end_with_a_one_line_error(capsys):
    assert main(["bench", "--workload", "mixed_short_long"]) == 2
    assert "exactly one of --base-url URL and --start-server" in capsys.readouterr().err
    assert main(["bench", "--base-url", "http://127.0.0.1:9", "--workload", "no_such_workload"]) == 2
    assert "unknown workload 'no_such_workload'" in capsys.readouterr().err
    assert main(["bench", "--base-url", "http://127.0.0.1:9", "--concurrency", "0"]) == 2
    assert "concurrency must be an integer >= 1" in capsys.readouterr().err


def test_vllm_result_format_and_percentiles(capsys):
    status = main(["bench", "--start-server", "--server-args=--num-blocks 64 --max-num-seqs 4",
                   "--random", "4", "--input-tokens", "4:8", "--output-tokens", "3:5", "--concurrency", "2",
                   "--percentiles", "50,99.9", "--result-format", "vllm", "--save-detailed", "--no-progress"])
    out = capsys.readouterr().out
    assert status == 0, out
    final = json.loads(out.strip().splitlines()[-1])
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p99.9"):
            assert final[f"{stat}_{metric}_ms"] is not None, (stat, metric)
    assert final["completed"] == 4 and final["max_concurrent_requests"] == 2 and final["max_output_tokens_per_s"] >= 1
    assert len(final["ttfts"]) == len(final["output_lens"]) == len(final["queue_times"]) == 4
    assert final["total_output_tokens"] == sum(final["output_lens"]) and all(final["generated_texts"])
    assert sum(q > 0 for q in final["queue_times"]) >= 1  # concurrency 2 for 4 requests: someone waited
    assert main(["bench", "--base-url", "http://127.0.0.1:9", "--percentiles", "0,50"]) == 2
    assert "percentiles must be in (0, 100)" in capsys.readouterr().err
