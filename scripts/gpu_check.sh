#!/usr/bin/env bash
# The GPU check, for the lent GPU machine (one call, at most 8 minutes) or, with --dry-run, a CPU host.
#
#   bash scripts/gpu_check.sh                      # on the GPU machine: writes $OUT (default /tmp/kregress-gpu-check)
#   bash scripts/gpu_check.sh --dry-run            # CPU host: the interpreter in place of the GPU, same summary
#   bash scripts/gpu_check.sh --rerun-failed PREV/summary.json   # only what failed last time (shorter)
#   other options (scripts/gpu_check.py --help): --out DIR, --budget S, --only PART,..., --part-timeout PART=S
#
# It runs with the machine's own python3 ($KREGRESS_CHECK_PYTHON to choose another) and installs only
# the carried wheels (scripts/gpu_wheels/, from scripts/fetch_gpu_wheels.sh) of what that Python lacks,
# into a temporary site dir (scripts/gpu_site.py); the machine's packages are never touched. The GPU
# clocks are read, never locked. Exit 0 when every item passed (or was planned / skipped with a reason).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${KREGRESS_CHECK_PYTHON:-python3}
out=${OUT:-/tmp/kregress-gpu-check}
wheels=${KREGRESS_CHECK_WHEELS:-scripts/gpu_wheels}
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out=$2; shift 2 ;;
        --wheels) wheels=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exec "$py" scripts/gpu_check.py --help ;;
        *) args+=("$1"); shift ;;
    esac
done
mkdir -p "$out"
site=$(mktemp -d "${TMPDIR:-/tmp}/kregress-site.XXXXXX")
trap 'rm -rf "$site"' EXIT
{
    echo "$(date -u +%FT%TZ) gpu_check.sh: $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    echo "tree: $(git rev-parse --short HEAD 2>/dev/null || echo '(not a git checkout)')$(git status --porcelain 2>/dev/null | grep -q . && echo ' + local changes')"
} > "$out/setup.log"
# KREGRESS_CHECK_BLOCK=dagster,openai,...: those modules cannot be imported by any part (as on the lent machine)
if ! "$py" scripts/gpu_site.py --wheels "$wheels" --target "$site" --log "$out/setup.log" \
        ${KREGRESS_CHECK_BLOCK:+--block "$KREGRESS_CHECK_BLOCK"} 2>>"$out/setup.log"; then
    echo "gpu_check.sh: installing the carried wheels failed; see $out/setup.log" >&2
    tail -5 "$out/setup.log" >&2
    exit 3
fi
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export KREGRESS_CHECK_SITE="$site" PYTHONUNBUFFERED=1
export TRITON_DEFAULT_FP_FUSION=${TRITON_DEFAULT_FP_FUSION:-1}
"$py" scripts/gpu_check.py --out "$out" ${args[@]+"${args[@]}"}
