"""Cut the recorded file kregress ships (data/replay/gemm_clblast_RTX_3090_trimmed.json.gz).

The full CLBlast Xgemm SGEMM space recorded on an RTX 3090 (17,956 valid configurations, 3.4 MB) lives
with the benchmark sets in ``../shared/data/replay/`` (or ``$KREGRESS_REPLAY_DIR``), not in the project.
The default replay spec and the tests need a file inside the project, so this script keeps one complete
sub-box of that space:

    SA = 1, SB = 1 (both operands staged in local memory), MDIMC = 16, NDIMC = 8   (754 configurations, 132 KiB)

and every other tunable at all its recorded values. ``tune_params`` lists only the kept values, so the
cut is itself a complete Kernel Tuner space: a point of the sub-box that is absent from ``cache`` was
ruled out by the kernel's own restrictions, exactly as in the full file. It keeps the recorded optimum
of the full file (5.658 ms, MWG=NWG=128) and mean times from 5.66 to 65.3 ms (median 11.42), so a search from the median
has real room to improve and to regress. Records are copied unchanged (all 32 runs each); the header
gets a ``kregress_trim`` note naming the source and the cut. gzip with mtime 0, so the output is
byte-identical on every run:

    .venv/bin/python scripts/trim_replay.py                       # from $KREGRESS_REPLAY_DIR or ../shared
    .venv/bin/python scripts/trim_replay.py --source FILE --out data/replay/gemm_clblast_RTX_3090_trimmed.json.gz

The data is MIT licensed (Copyright (c) 2025 AutoTuningAssociation); data/replay/NOTICE keeps the
notice and the citation beside the file.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kregress.core.recorded import ReplayError, ReplayTable, replay_path, shipped_path  # noqa: E402

CUT = {"SA": [1], "SB": [1], "MDIMC": [16], "NDIMC": [8]}
SOURCE = ("AutoTuningAssociation/benchmark_hub@8eeb99e7179e6838af95d392ac6c60cebfd8c434: "
          "currently_unused/cachefiles/KernelTuner data/gemm/RTX_3090.json.gz")


def trim(source: Path, cut: dict[str, list[int]] = CUT) -> tuple[dict, bytes]:
    raw = source.read_bytes()
    data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    keys = data["tune_params_keys"]
    unknown = [k for k in cut if k not in keys]
    if unknown:
        raise SystemExit(f"{source}: no tunable {', '.join(unknown)} (tunables: {', '.join(keys)})")
    pos = {k: i for i, k in enumerate(keys)}
    kept = {}
    for ck, rec in data["cache"].items():
        vals = [int(x) for x in ck.split(",")]
        if all(vals[pos[k]] in allowed for k, allowed in cut.items()):
            kept[ck] = rec
    out = dict(data)
    out["tune_params"] = {k: (list(cut[k]) if k in cut else v) for k, v in data["tune_params"].items()}
    out["cache"] = kept
    out["kregress_trim"] = {
        "source": SOURCE,
        "source_sha256": hashlib.sha256(raw).hexdigest(),
        "cut": cut,
        "kept": len(kept),
        "of": len(data["cache"]),
        "made_by": "scripts/trim_replay.py",
        "license": "MIT, Copyright (c) 2025 AutoTuningAssociation (see NOTICE beside this file)",
    }
    blob = gzip.compress(json.dumps(out, separators=(",", ":")).encode(), compresslevel=9, mtime=0)
    return out, blob


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=None, help=f"the full file (default {replay_path()})")
    ap.add_argument("--out", type=Path, default=shipped_path())
    args = ap.parse_args(argv)
    source = args.source or replay_path()
    if not source.is_file():
        print(f"{source}: not found; set KREGRESS_REPLAY_DIR to the folder holding gemm_clblast_RTX_3090.json.gz "
              "or pass --source", file=sys.stderr)
        return 2
    out, blob = trim(source)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(blob)
    try:
        table = ReplayTable.load(args.out)
    except ReplayError as exc:
        print(exc, file=sys.stderr)
        return 1
    times = sorted(r.time for r in table.records())
    print(f"{args.out}: {len(table)} of {out['kregress_trim']['of']} configurations, {len(blob) / 1024:.0f} KiB, "
          f"best {times[0]:.3f} ms, median {table.median().time:.3f} ms, worst {times[-1]:.3f} ms, "
          f"sha256 {hashlib.sha256(blob).hexdigest()[:16]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
