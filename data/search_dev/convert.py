"""Build data/search_dev/: the search benchmark's development set, from public recorded Kernel Tuner (and KTT) runs.

Every file comes from one public repository, AutoTuningAssociation/benchmark_hub (MIT License, Copyright (c)
2025 AutoTuningAssociation; the notice is in LICENSE here), at snapshot commit ``COMMIT``. Each source is
read from a local git mirror of that repository (``git show COMMIT:PATH``) and written here as a small Kernel
Tuner cache file:

* the header keeps ``device_name``, ``kernel_name``, ``problem_size``, ``tune_params_keys``, ``tune_params``
  and ``objective`` ("time"), plus ``kregress_source`` (repository, commit, path, sha256 of the source);
* each record keeps only the median of its recorded runs, to 5 significant digits, as ``time`` and as the
  one element of ``times`` (the benchmark's objective is that median); a failure keeps its failure string.
  The 10 or 32 individual runs are dropped: the files shrink from about 30 MB to about 1 MB;
* KTT output (the ``ktt_*`` files: one ``Duration`` in microseconds per configuration) becomes the same
  format: ``time`` in ms, a status other than ``Ok`` a ``RuntimeFailedConfig`` (``CompilationFailedConfig``
  for a compile failure), ``problem_size`` [1] (KTT's output does not record it).

Spaces held back from development by issue 34 are never read: milo convolution on W6600, A100 and MI250X,
milo dedispersion on W6600, and CLBlast GEMM on RTX 2080 Ti and RTX Titan. Two sources that hold the same
medians as another (``currently_unused/cachefiles/convolution/RTX_2080_Ti`` and ``RTX_3090``, copies of the
``KernelTuner data`` ones) are left out. Run (byte-identical output on every run)::

    .venv/bin/python data/search_dev/convert.py --mirror PATH/TO/benchmark_hub.git
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = "AutoTuningAssociation/benchmark_hub"
COMMIT = "8eeb99e7179e6838af95d392ac6c60cebfd8c434"
KT = "currently_unused/cachefiles/KernelTuner data"
KTT = "currently_unused/cachefiles/KTT data"
# name here -> path in the repository; the name says kernel, source set and GPU
SOURCES = {
    "convolution_milo_A6000": "cachefiles/convolution_milo/A6000.json.gz",
    "convolution_milo_A6000_original": "cachefiles/convolution_milo/A6000_original.json.gz",
    "convolution_milo_W7800": "cachefiles/convolution_milo/W7800.json.gz",
    "convolution_milo6_A4000": f"{KT}/convolution_milo/a4000.json.gz",
    "convolution_milo6_MI50": f"{KT}/convolution_milo/mi50.json.gz",
    "convolution_RTX_2080_Ti": f"{KT}/convolution/RTX_2080_Ti.json.gz",
    "convolution_RTX_3060_laptop": f"{KT}/convolution/RTX_3060_laptop.json.gz",
    "convolution_RTX_3090": f"{KT}/convolution/RTX_3090.json.gz",
    "convolution_RTX_Titan": f"{KT}/convolution/RTX_Titan.json.gz",
    "gemm_clblast_RTX_3060_laptop": f"{KT}/gemm/RTX_3060_laptop.json.gz",
    "pnpoly_RTX_2080_Ti": f"{KT}/pnpoly/RTX_2080_Ti.json.gz",
    "pnpoly_RTX_2080_Ti_2": "currently_unused/cachefiles/pnpoly/RTX_2080_Ti.json.gz",
    "pnpoly_RTX_3060_laptop": f"{KT}/pnpoly/RTX_3060_laptop.json.gz",
    "pnpoly_RTX_Titan": f"{KT}/pnpoly/RTX_Titan.json.gz",
    "dedispersion_milo_A100": "cachefiles/dedispersion_milo/A100.json.gz",
    "dedispersion_milo_A6000": "cachefiles/dedispersion_milo/A6000.json.gz",
    "dedispersion_milo_MI250X": "cachefiles/dedispersion_milo/MI250X.json.gz",
    "dedispersion_milo_W7800": "cachefiles/dedispersion_milo/W7800.json.gz",
    "ktt_convolution_RTX_2080_Ti": f"{KTT}/KTConvolutionOutput_2080Ti.json.gz",
    "ktt_convolution_RTX_3090": f"{KTT}/KTConvolutionOutput_3090.json.gz",
    "ktt_pnpoly_RTX_2080_Ti": f"{KTT}/KTPnpolyOutput_2080Ti.json.gz",
    "ktt_pnpoly_RTX_3090": f"{KTT}/KTPnpolyOutput_3090.json.gz",
}
DEVICE_FIX = {"dedispersion_milo_MI250X": "AMD Instinct MI250X"}  # the source's device_name is empty


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return (s[(n - 1) // 2] + s[n // 2]) / 2


def _r(x: float) -> float:
    return float(f"{x:.5g}")


def from_kt(data: dict) -> dict:
    cache = {}
    for key, rec in data["cache"].items():
        t = rec.get("time")
        if isinstance(t, str):
            cache[key] = {"time": t}
            continue
        v = _r(_median([float(x) for x in rec.get("times") or [t]]))
        cache[key] = {"time": v, "times": [v]}
    out = {k: data[k] for k in ("device_name", "kernel_name", "problem_size", "tune_params_keys", "tune_params")}
    out["objective"] = "time"
    out["cache"] = cache
    return out


def from_ktt(data: dict) -> dict:
    results = data["Results"]
    keys = [c["Name"] for c in results[0]["Configuration"]]
    values: dict[str, set[int]] = {k: set() for k in keys}
    cache = {}
    for r in results:
        cfg = {c["Name"]: int(c["Value"]) for c in r["Configuration"]}
        for k in keys:
            values[k].add(cfg[k])
        key = ",".join(str(cfg[k]) for k in keys)
        if r["Status"] != "Ok":
            cache[key] = {"time": "CompilationFailedConfig" if "Compil" in r["Status"] else "RuntimeFailedConfig"}
            continue
        v = _r(sum(float(c["Duration"]) for c in r["ComputationResults"]) / 1000.0)  # us -> ms
        cache[key] = {"time": v, "times": [v]}
    return {"device_name": data["Metadata"]["Device"], "kernel_name": results[0]["KernelName"], "problem_size": [1],
            "tune_params_keys": keys, "tune_params": {k: sorted(values[k]) for k in keys}, "objective": "time",
            "cache": cache}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--mirror", required=True, help="a git clone or mirror of github.com/" + REPO)
    ap.add_argument("--out", default=str(HERE))
    args = ap.parse_args()
    for name, path in SOURCES.items():
        raw = subprocess.run(["git", "-C", args.mirror, "show", f"{COMMIT}:{path}"], check=True,
                             capture_output=True).stdout
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        data = json.loads(text)
        out = from_ktt(data) if "Results" in data else from_kt(data)
        if name in DEVICE_FIX:
            out["device_name"] = DEVICE_FIX[name]
        out["kregress_source"] = {"repository": REPO, "commit": COMMIT, "path": path,
                                  "sha256": hashlib.sha256(raw).hexdigest(),
                                  "kept": "the median of each record's runs (5 significant digits), failures as recorded"}
        out["cache"] = out.pop("cache")  # last, as Kernel Tuner writes it (it reads a file that is not so as open)
        blob = gzip.compress(json.dumps(out, separators=(",", ":")).encode(), 9, mtime=0)
        Path(args.out, f"{name}.json.gz").write_bytes(blob)
        print(f"{name}: {len(out['cache'])} configs, {len(blob):,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
