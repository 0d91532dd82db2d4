#!/usr/bin/env bash
# The GPU-host check, as one script: the gpu-marked tests, then the benchmarks on the cuda backend.
# Usage (on a machine with a CUDA GPU and this repo installed): bash scripts/gpu_check.sh [OUT_DIR]
# The families step prints each spec's baseline TFLOP/s against the FP8 peak (gemm_fp8,
# grouped_gemm_fp8) or the BF16 peak (gemm, attention), GB/s against HBM for mla_decode.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/kregress-gpu}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
.venv/bin/python -m pytest -q -m gpu 2>&1 | tee "$out/pytest_gpu.log"
.venv/bin/python bench/pipeline.py specs/gemm_h100_bf16.yaml --env gpu 2>&1 | tee "$out/bench_pipeline_cuda.log"
.venv/bin/python bench/families.py --cuda --families gemm_fp8 grouped_gemm_fp8 grouped_gemm_fp8_masked \
    attention_deepseek attention mla_decode gemm 2>&1 | tee "$out/bench_families_cuda.log"
.venv/bin/python bench/families.py 2>&1 | tee "$out/bench_families.log"
