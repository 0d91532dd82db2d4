#!/usr/bin/env bash
# Download the wheels the GPU check needs and the lent GPU machine lacks, for its Python (3.12,
# CPython, manylinux x86_64), into an ignored folder that travels with the working tree (`carry`),
# and print their total size beside the tracked tree's (everything that travels: <= 64 MiB).
#
#   bash scripts/fetch_gpu_wheels.sh                       # pydantic (+ deps) and pytest-timeout, cp312
#   bash scripts/fetch_gpu_wheels.sh --with-dagster        # also Dagster: the Dagster-backed gpu tests run
#   bash scripts/fetch_gpu_wheels.sh --python-version 3.11 # this host's Python (CI's dry run)
#   options: --dest DIR (default scripts/gpu_wheels)
# Needs a package index (run it here, not on the GPU machine). scripts/gpu_site.py installs them there.
set -euo pipefail
cd "$(dirname "$0")/.."
pyver=3.12
dest=scripts/gpu_wheels
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --python-version) pyver=$2; shift 2 ;;
        --dest) dest=$2; shift 2 ;;
        --with-dagster) extra+=(--with-dagster); shift ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "fetch_gpu_wheels.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
py=${PYTHON:-python3}
mkdir -p "$dest"
reqs=$(mktemp)
trap 'rm -f "$reqs"' EXIT
"$py" scripts/gpu_site.py --requirements ${extra[@]+"${extra[@]}"} > "$reqs"
"$py" -m pip download --quiet --disable-pip-version-check --only-binary=:all: --implementation cp \
    --python-version "$pyver" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 -d "$dest" -r "$reqs" 2> >(grep -v "is ignored: it is neither" >&2)
"$py" - "$dest" <<'PY'
import subprocess, sys
from pathlib import Path
dest = Path(sys.argv[1])
wheels = sorted(dest.glob("*.whl"))
total = sum(w.stat().st_size for w in wheels)
for w in wheels:
    print(f"{w.stat().st_size / 2**20:8.2f} MiB  {w.name}")
tracked = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout.split(b"\0")
tree = sum(Path(p.decode()).stat().st_size for p in tracked if p and Path(p.decode()).is_file())
print(f"wheels: {len(wheels)} files, {total / 2**20:.2f} MiB in {dest}")
print(f"tracked tree: {tree / 2**20:.2f} MiB; together {(total + tree) / 2**20:.2f} MiB of the 64 MiB that may travel")
sys.exit(0 if total + tree <= 64 * 2**20 else 1)
PY
