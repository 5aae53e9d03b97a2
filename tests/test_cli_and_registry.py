"""The command line and the model registry: useful output, and errors that say what to do."""

from __future__ import annotations

import pytest
import torch

import workbench
from workbench.cli import main
from workbench.models import ModelNotFoundError


def test_generate_streams_text_and_reports_speed(capsys):
    assert main(["generate", "Name three colours.", "--max-tokens", "12"]) == 0
    out, err = capsys.readouterr()
    assert out.strip()
    assert "TTFT" in err and "tokens/s" in err


def test_info_reports_shape_and_kv_bytes(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "GQA: 9 query heads, 3 KV heads, head_dim 64" in out
    assert "46,080 B" in out  # 2 x 30 layers x 3 KV heads x 64 x 4 bytes (float32)


@pytest.mark.parametrize("argv,message", [
    (["generate", ""], "non-empty"),
    (["generate", "hi", "--max-tokens", "0"], "max_tokens"),
    (["generate", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "hi", "--top-p", "0"], "top_p"),
    (["generate", "hi", "--model", "gpt-9"], "unknown model"),
    (["info", "--model", "gpt-9"], "unknown"),
])
def test_bad_input_exits_2_with_a_clear_message(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_missing_model_names_the_command_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="make model"):
        workbench.load_model()


def test_every_config_reads_and_counts_parameters():
    expected_billions = {"llama-3-8b": 8.03, "llama-3-70b": 70.55, "llama-2-70b": 68.98, "llama-2-7b": 6.74,
                         "mistral-7b": 7.24, "qwen2.5-7b": 7.62, "smollm2-135m": 0.1345,
                         "llama-3.1-8b": 8.03, "llama-3.1-70b": 70.55}
    assert set(workbench.config_names()) == set(expected_billions)
    for name, billions in expected_billions.items():
        assert workbench.model_spec(name).num_parameters() / 1e9 == pytest.approx(billions, rel=0.01), name


def test_random_model_refuses_what_cannot_fit():
    with pytest.raises(ValueError, match="num_layers"):
        workbench.random_model("llama-3-70b", device="cpu")
    small = workbench.random_model("llama-3-8b", num_layers=1, dtype=torch.bfloat16, device="cpu")
    assert small.spec.num_layers == 1 and small.spec.hidden_size == 4096


def test_unsupported_architecture_is_rejected():
    from workbench.config import ModelSpec

    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        ModelSpec.from_hf_config({"model_type": "gpt2"})
    with pytest.raises(ValueError, match="multiple"):
        workbench.model_spec("llama-3-8b").replace(num_kv_heads=5)


def test_a_device_this_build_cannot_use_is_a_one_line_error(capsys, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU build, as the workshop machines have
    assert main(["generate", "hi", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: device 'cuda'") and "CPU build" in err and "--device cpu" in err
    assert "Traceback" not in err and err.count("\n") == 1
    assert main(["info", "--device", "gpu"]) == 2
    assert "unknown device 'gpu': use cpu, cuda or cuda:N" in capsys.readouterr().err


def test_an_architecture_asked_for_text_is_explained_not_unknown(capsys):
    assert main(["generate", "hi", "--model", "llama-3-8b"]) == 2
    err = capsys.readouterr().err
    assert "unknown" not in err and "without trained weights" in err
    assert "workbench info --model llama-3-8b" in err and "['smollm2-135m']" in err


def test_info_sizes_a_gpu_deployment_in_the_checkpoint_dtype_and_says_so(capsys):
    assert main(["info", "--model", "llama-3-70b", "--tensor-parallel", "8"]) == 0
    out = capsys.readouterr().out
    assert "bfloat16 (the checkpoint's" in out and "327,680 B (320.0 KiB)" in out  # 2 x 80 x 8 x 128 x 2 bytes
    assert "weights per GPU (even split)  16.43 GiB" in out and "70.55 B" in out
    assert "device" not in out  # an architecture-only query runs nothing here
    assert main(["info", "--model", "llama-3-70b", "-tp", "8", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "float32 (--dtype)" in out and "655,360 B" in out
    assert main(["info"]) == 0  # the real model on one device: what `workbench generate` runs
    assert "float32 (as workbench generate runs it" in capsys.readouterr().out


def test_help_is_plain_text_and_names_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and "`" not in out.split("positional")[0]
    for command in ("generate", "info", "fetch", "serve", "bench"):
        assert f"workbench {command}" in out
    assert "135 million parameters" in out


def test_a_kv_format_asked_of_the_weights_says_where_it_belongs(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "hi", "--weights", "int4"])
    err = capsys.readouterr().err
    assert "invalid weight format 'int4'" in err and "--kv-cache-dtype int4" in err and "q4_1" in err
    with pytest.raises(SystemExit):
        main(["info", "--weights", "int3"])
    assert "KV-cache" not in capsys.readouterr().err
