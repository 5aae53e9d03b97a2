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
