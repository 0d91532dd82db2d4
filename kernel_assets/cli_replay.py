"""`kregress replay ...`: turn any Kernel Tuner cache file into a replay spec.

    kregress replay import FILE [--out SPEC] [--task-id ID] [--force]

The spec it writes is ready for ``kregress specs validate`` and ``kregress sweep``: ``kernel_family:
replay``, ``params.cache_file`` naming FILE, the file's one problem (``problem_size`` as ``x``, ``y``,
``z``), the device from the file (arch and limits filled in for GPUs kregress knows, else left at the
defaults with a note), and as baseline the configuration of median recorded time among the valid ones,
so the search has room to improve and verdicts go both ways. Default ``--out``: ``specs/<task_id>.yaml``
under the current directory; the task id comes from the file name.

``cache_file`` is written as the bare name when FILE is one of the files shipped in ``data/replay/``,
relative to the spec's folder when FILE lies below it, else as an absolute path.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

# Ampere GPUs the bundled recordings come from; limits are the vendor's per-SM figures (fp32 peak).
KNOWN_DEVICES: dict[str, dict[str, Any]] = {
    "NVIDIA GeForce RTX 3090": {
        "arch": "sm_86",
        "limits": {"sm_count": 82, "peak_tflops": 35.6, "hbm_gbps": 936.0, "shared_memory_per_sm": 102400,
                   "max_shared_memory_per_block": 101376, "max_threads_per_sm": 1536, "max_blocks_per_sm": 16,
                   "l2_bytes": 6291456},
    },
    "NVIDIA RTX A4000": {
        "arch": "sm_86",
        "limits": {"sm_count": 48, "peak_tflops": 19.2, "hbm_gbps": 448.0, "shared_memory_per_sm": 102400,
                   "max_shared_memory_per_block": 101376, "max_threads_per_sm": 1536, "max_blocks_per_sm": 16,
                   "l2_bytes": 4194304},
    },
}
GUARD_RATIO = 1.03
MIN_SAMPLES = 10


def register(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser("replay", help="recorded Kernel Tuner cache files: import one as a replay spec",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rsub = rp.add_subparsers(dest="replay_command", required=True)
    imp = rsub.add_parser("import", help="write a replay spec for a Kernel Tuner cache file")
    imp.add_argument("file", help="a Kernel Tuner cache file (.json or .json.gz)")
    imp.add_argument("--out", help="spec path to write (default: specs/<task_id>.yaml)")
    imp.add_argument("--task-id", help="default: from the file name")
    imp.add_argument("--force", action="store_true", help="overwrite an existing spec file")
    imp.set_defaults(func=cmd_import)


def task_id_for(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    tid = re.sub(r"[^a-z0-9_-]+", "_", name.lower()).strip("_-")
    return (tid or "replay")[:63]


def cache_file_value(file: Path, spec_dir: Path) -> str:
    from kregress.core.recorded import SHIPPED_DIR

    file = file.resolve()
    if file.parent == SHIPPED_DIR.resolve():
        return file.name
    try:
        return file.relative_to(spec_dir.resolve()).as_posix()
    except ValueError:
        return str(file)


def spec_for(table, cache_file: str, task_id: str) -> tuple[dict[str, Any], list[str]]:
    """(the spec as data, header comment lines) for a loaded ReplayTable."""
    from kernels.replay_family import shape_for
    from kregress.core.recorded import DEFAULTED_KEYS

    valid = list(table.records())
    failures = table.failures()
    med = table.median()
    runs = table.runs_per_config
    shape = shape_for(table)
    known = KNOWN_DEVICES.get(table.device_name)
    hardware: dict[str, Any] = {"device": table.device_name}
    notes = [f"Imported by `kregress replay import` from {table.path.name} (sha256 {table.content_hash[:16]}).",
             f"{table.kernel_name} on {table.device_name}: {len(table)} recorded configurations, "
             f"{len(failures)} of them recorded failures, {runs} runs per valid configuration."]
    notes += [f"Assumed: {a}." for a in table.assumed]
    if known:
        hardware.update(known)
    elif table.device_name != DEFAULTED_KEYS["device_name"][0]:  # an unnamed device has its note already
        notes.append(f"Device {table.device_name!r} is not in kregress's table: arch and limits are the defaults "
                     "(an H100's); edit hardware: for your GPU (replay verdicts do not depend on them).")
    notes.append(f"Baseline: the configuration of median recorded time among the {len(valid)} valid ones "
                 f"({med.time:.4g} ms; best recorded {table.best().time:.4g} ms).")
    min_samples = max(3, min(MIN_SAMPLES, runs))
    if min_samples < MIN_SAMPLES:
        notes.append(f"min_samples is {min_samples}: the file records only {runs} runs per configuration.")
    data = {
        "task_id": task_id,
        "description": (f"Replay of a Kernel Tuner cache ({table.kernel_name}, problem size "
                        f"{table.shape_label}, {table.device_name}); baseline = the configuration of median "
                        f"recorded time among the {len(valid)} valid ones."),
        "kernel_family": "replay",
        "dtype": "fp32",
        "hardware": hardware,
        "shape_matrix": [shape],
        "correctness_shapes": [dict(shape)],
        "regression_guard": {"not_worse_than_baseline_ratio": GUARD_RATIO, "min_samples": min_samples},
        # the device's own per-block shared memory, not an H100's (recorded runs are not compile-checked)
        **({"constraints": {"max_shared_memory_bytes": known["limits"]["max_shared_memory_per_block"]}} if known else {}),
        "search": {"strategy": "local", "variants_per_round": 8, "max_rounds": 3, "no_improve_rounds": 2, "seed": 0},
        "baseline": med.config,
        "params": {"cache_file": cache_file},
    }
    return data, notes


def render(data: dict[str, Any], notes: list[str]) -> str:
    import yaml

    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=10_000)
    return "".join(f"# {n}\n" for n in notes) + body


def import_file(file: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
                task_id: str | None = None, force: bool = False) -> Path:
    """Write the spec for ``file``; returns its path. Raises ValueError with one line on any problem."""
    from kregress.core.recorded import ReplayError, ReplayTable
    from kregress.core.spec import SpecError, load_spec

    src = Path(file).expanduser()
    try:
        table = ReplayTable.load(src)
    except ReplayError as exc:
        raise ValueError(str(exc)) from None
    tid = task_id or task_id_for(src)
    dest = Path(out) if out else Path("specs") / f"{tid}.yaml"
    if dest.exists() and not force:
        raise ValueError(f"{dest} exists; pass --force to overwrite it or --out another path")
    dest.parent.mkdir(parents=True, exist_ok=True)
    data, notes = spec_for(table, cache_file_value(src, dest.parent), tid)
    dest.write_text(render(data, notes))
    try:
        load_spec(dest)
    except SpecError as exc:  # should not happen: say what the import got wrong, keep the file to inspect
        raise ValueError(f"{dest}: the imported spec does not validate: {str(exc).splitlines()[0]}") from None
    return dest


def cmd_import(args: argparse.Namespace) -> int:
    try:
        dest = import_file(args.file, args.out, args.task_id, args.force)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from kregress.core.recorded import ReplayTable

    for note in ReplayTable.load(Path(args.file).expanduser()).assumed:
        print(f"note: {note}")
    print(f"wrote {dest}; next: kregress specs validate {dest} && kregress sweep {dest}")
    return 0
