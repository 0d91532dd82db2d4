#!/usr/bin/env bash
# CI's second job (.ci/run, after the README's test command): the lent GPU machine's Triton 3.6 beside
# torch 2.13, and the GPU check's dry run under Triton 3.6 and the newest Triton.
#
# 1. .venv36: the project with triton==3.6.0 (checked: pip must not swap it for a newer one); the
#    kernel tests (interpreter correctness, AOT compiles for sm_90), the interpreter fixes' tests and
#    the GPU check's own tests run there.
# 2. Two minimal environments like the GPU machine's (torch, Triton 3.6 or 3.9, numpy, pandas, pyarrow,
#    PyYAML, scipy, matplotlib, pytest; no Dagster, no pydantic), the carried wheels fetched for this
#    host's Python (and the GPU machine's 3.12 set, whose size is printed), then
#    `scripts/gpu_check.sh --dry-run` in each with dagster, openai, optuna and sqlalchemy blocked
#    (KREGRESS_CHECK_BLOCK): every part, one summary each under ci-gpu-check/.
# Exit non-zero when any step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
stamp() { echo "[ci_triton36 +$(( $(date +%s) - t0 ))s] $*"; }
quiet_pip() { grep -v -e "is ignored: it is neither" -e "^WARNING: Location" || true; }
hostpy=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
base="numpy pandas pyarrow pyyaml scipy matplotlib pytest"

stamp "environments: .venv36 (project, triton 3.6), .venv-min36 and .venv-min39 (the GPU machine's set)"
python3 -m venv .venv36
.venv36/bin/pip install -q torch==2.13.0 triton==3.6.0 -e '.[test]' 2>&1 | quiet_pip
for v in 36:3.6.0 39:3.9.0; do
    python3 -m venv ".venv-min${v%%:*}"
    ".venv-min${v%%:*}/bin/pip" install -q torch==2.13.0 "triton==${v##*:}" $base 2>&1 | quiet_pip
done
for env in .venv36:3.6.0 .venv-min36:3.6.0 .venv-min39:3.9.0; do
    "${env%%:*}/bin/python" -c "import sys, triton; v = triton.__version__; print('${env%%:*}: triton', v); sys.exit(v != '${env##*:}')"
done
if .venv-min36/bin/python -c "import pydantic" 2>/dev/null || .venv-min36/bin/python -c "import dagster" 2>/dev/null; then
    echo "ci_triton36: the minimal environment has pydantic or Dagster; it must not (the GPU machine has neither)" >&2
    exit 1
fi

stamp "carried wheels: the GPU machine's (cp312) and this host's (cp${hostpy/./})"
bash scripts/fetch_gpu_wheels.sh | tail -2
bash scripts/fetch_gpu_wheels.sh --python-version "$hostpy" | tail -1

stamp "Triton 3.6: kernel tests, AOT compiles, interpreter fixes, the check's own tests"
.venv36/bin/python -m pytest -q -p no:cacheprovider tests/test_gemm.py tests/test_gemm_fp8.py tests/test_attention.py \
    tests/test_mla_decode.py tests/test_mla_causal.py tests/test_interpreter_fixes.py tests/test_gpu_check.py

rm -rf ci-gpu-check
for v in 39 36; do
    stamp "dry run of the GPU check, minimal environment, Triton ${v:0:1}.${v:1}"
    KREGRESS_CHECK_PYTHON=".venv-min$v/bin/python" KREGRESS_CHECK_BLOCK=dagster,openai,optuna,sqlalchemy \
        bash scripts/gpu_check.sh --dry-run --out "ci-gpu-check/triton$v"
done
stamp "done"
