"""Install the carried wheels the GPU check needs and this Python lacks, into a temporary site dir.

The lent GPU machine has torch, Triton, numpy, pandas, pyarrow, PyYAML, scipy, matplotlib and
pytest, but not pydantic (kregress.core's records and specs), and it cannot reach a package index.
``scripts/fetch_gpu_wheels.sh`` downloads the wheels here (``scripts/gpu_wheels/``, carried with the
working tree); this script, run by ``scripts/gpu_check.sh`` with the machine's own ``python3``:

1. checks each requirement against this Python's installed distributions (importlib.metadata);
2. installs the missing (or too old) ones with ``pip install --no-index --find-links WHEELS
   --target SITE`` (or, where this Python has no pip, by unpacking the compatible wheels);
3. removes again from SITE every distribution the machine already has at a version that satisfies
   what the installed ones require (pip --target installs a whole closure, e.g. typing_extensions,
   which torch already brought): the machine's packages are never shadowed without need;
4. when this Python does not have the project itself installed (the GPU machine runs the tree from
   PYTHONPATH), writes the tree's metadata only (``<name>-<version>.dist-info`` with METADATA and
   the ``[project.entry-points]`` of its pyproject.toml) into SITE, so that importlib.metadata finds
   the entry points the tree declares (the family registry reads its built-ins there); no code is
   copied: the modules are imported from the tree;
5. writes what it did to SITE/kregress_site.json (the check copies it into its summary).

The machine's own packages are never touched; SITE is put first on PYTHONPATH by the caller.

    python3 scripts/gpu_site.py --wheels scripts/gpu_wheels --target /tmp/site [--no-pip]
    python3 scripts/gpu_site.py --requirements [--with-dagster]      # what fetch_gpu_wheels.sh downloads
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path

# What the check imports that the machine lacks: kregress.core (records, specs) needs pydantic.
REQUIRED = ("pydantic>=2.7",)
# Installed when their wheels were carried and the machine lacks them: pytest-timeout bounds each
# gpu-marked test; Dagster lets the gpu-marked tests that exercise the Dagster resources (CudaBackend)
# run (the check's own parts never import it).
OPTIONAL = ("pytest-timeout>=2.3",)
DAGSTER = ("dagster>=1.13,<1.14",)
RECORD_NAME = "kregress_site.json"


def _req(text: str):
    from packaging.requirements import Requirement

    return Requirement(text)


def _canon(name: str) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def base_version(project: str) -> str | None:
    """The version of ``project`` this Python has installed (without SITE on its path), or None."""
    try:
        return metadata.version(project)
    except metadata.PackageNotFoundError:
        return None


def satisfied(req_text: str) -> tuple[bool, str | None]:
    req = _req(req_text)
    have = base_version(req.name)
    return (have is not None and req.specifier.contains(have, prereleases=True)), have


def wheel_projects(wheels: Path) -> dict[str, list[Path]]:
    """{canonical project: [wheel files]} of the folder."""
    from packaging.utils import parse_wheel_filename

    out: dict[str, list[Path]] = {}
    for whl in sorted(wheels.glob("*.whl")):
        name, _ver, _build, _tags = parse_wheel_filename(whl.name)
        out.setdefault(_canon(name), []).append(whl)
    return out


def wanted(wheels: Path) -> list[str]:
    """REQUIRED, plus each OPTIONAL / Dagster requirement whose wheel was carried."""
    have = wheel_projects(wheels) if wheels.is_dir() else {}
    reqs = list(REQUIRED)
    reqs += [r for r in OPTIONAL + DAGSTER if _canon(_req(r).name) in have]
    return reqs


def _compatible(whl: Path) -> bool:
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    tags = set(sys_tags())
    return bool(parse_wheel_filename(whl.name)[3] & tags)


def _pip_available(python: str) -> bool:
    return subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0


def install_with_pip(reqs: list[str], wheels: Path, target: Path, log) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # only the carried wheels, whatever this host's pip config says
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(wheels), "--target", str(target),
           "--only-binary=:all:", "--no-compile", *reqs]
    log(f"$ {' '.join(cmd)}")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    log(proc.stdout + proc.stderr)
    if proc.returncode:
        raise SystemExit(f"gpu_site: pip could not install {', '.join(reqs)} from {wheels} (exit {proc.returncode}); "
                         f"the wheels there are for another Python or platform, or one is missing: re-run "
                         f"scripts/fetch_gpu_wheels.sh --python-version {sys.version_info[0]}.{sys.version_info[1]}")


def install_by_unpacking(reqs: list[str], wheels: Path, target: Path, log) -> dict[str, str]:
    """No pip on this Python: unpack, per project, the newest wheel compatible with this interpreter,
    for every project of the folder that this Python lacks (the folder holds one closure, as
    fetch_gpu_wheels.sh downloads it)."""
    from packaging.utils import parse_wheel_filename

    machine_has = {}
    for project, files in wheel_projects(wheels).items():
        ok = [f for f in files if _compatible(f)]
        if not ok:
            continue
        best = max(ok, key=lambda f: parse_wheel_filename(f.name)[1])
        have = base_version(project)
        if have is not None:
            machine_has[project] = have  # a project this Python has is kept (the folder is one closure)
            log(f"not needed: {best.name} (this Python has {project} {have})")
            continue
        log(f"unpacking {best.name}")
        with zipfile.ZipFile(best) as zf:
            zf.extractall(target)
    missing = [r for r in reqs if not any(_canon(_req(r).name) == _canon(d.metadata["Name"])
                                          for d in metadata.distributions(path=[str(target)]))
               and not satisfied(r)[0]]
    if missing:
        raise SystemExit(f"gpu_site: no wheel in {wheels} fits this Python for {', '.join(missing)}: run "
                         f"scripts/fetch_gpu_wheels.sh --python-version {sys.version_info[0]}.{sys.version_info[1]}")
    return machine_has


def prune(target: Path, top: list[str], log) -> dict[str, str]:
    """Remove from ``target`` each distribution the machine already has at a version that satisfies
    every requirement on it (the top-level ones and those of the distributions in ``target``)."""
    from packaging.markers import default_environment

    dists = list(metadata.distributions(path=[str(target)]))
    specs: dict[str, list] = {}
    env = default_environment()
    for text in top:
        r = _req(text)
        specs.setdefault(_canon(r.name), []).append(r.specifier)
    for d in dists:
        for text in d.requires or []:
            r = _req(text)
            if r.marker is not None and not r.marker.evaluate({**env, "extra": ""}):
                continue
            specs.setdefault(_canon(r.name), []).append(r.specifier)
    kept_base: dict[str, str] = {}
    for d in dists:
        name = _canon(d.metadata["Name"])
        have = base_version(name)
        if have is None or not all(s.contains(have, prereleases=True) for s in specs.get(name, [])):
            continue
        version = d.version
        for f in d.files or []:  # RECORD lists every file, the dist-info folder's own included
            path = target / str(f)
            if path.is_file():
                path.unlink()
        kept_base[name] = have
        log(f"not needed: {name} {version} (this Python has {have})")
    # console scripts (pip --target puts them in bin/, with RECORD paths outside target): the check
    # runs everything as `python -m`, and a script of a pruned distribution would point at nothing
    shutil.rmtree(target / "bin", ignore_errors=True)
    # folders left empty by the removal
    for p in sorted(target.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if p.is_dir() and not any(p.iterdir()):
            p.rmdir()
    return kept_base


def tree_metadata(project: Path, target: Path, log) -> dict:
    """The tree's dist-info (METADATA + entry_points.txt from pyproject.toml) in ``target``, unless this
    Python has the project installed (then its own metadata serves)."""
    pyproject = project / "pyproject.toml"
    if not pyproject.is_file():
        return {"written": False, "why": f"no {pyproject}"}
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            return {"written": False, "why": "no TOML reader on this Python (tomllib is 3.11+, tomli absent)"}
    meta = tomllib.loads(pyproject.read_text()).get("project", {})
    name, version = meta.get("name"), meta.get("version", "0")
    if not name:
        return {"written": False, "why": f"{pyproject} has no [project] name"}
    have = base_version(name)
    if have is not None:
        return {"written": False, "why": f"this Python has {name} {have} installed"}
    groups = meta.get("entry-points", {})
    info = target / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   f"Summary: the working tree at {project} (imported from PYTHONPATH; metadata only)\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for group, eps in groups.items()))
    files = ["METADATA", "entry_points.txt", "RECORD"]
    (info / "RECORD").write_text("".join(f"{info.name}/{f},,\n" for f in files))
    log(f"tree metadata: {info.name} with entry-point groups {', '.join(groups) or 'none'}")
    return {"written": True, "name": name, "dist_info": info.name,
            "entry_point_groups": {g: sorted(e) for g, e in groups.items()}}


BLOCKER = """# written by scripts/gpu_site.py --block: these modules cannot be imported in this process or its children
import sys

_BLOCKED = frozenset({names!r})


class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by scripts/gpu_site.py --block)", name=name)
        return None


sys.meta_path.insert(0, _Blocked())
"""


def write_blocker(target: Path, spec: str, log) -> list[str]:
    """With ``--block a,b``: SITE/sitecustomize.py makes those top-level modules unimportable (a dry run that
    proves the check needs none of them, even on a host that has them). Returns the blocked names."""
    names = sorted({n.strip() for n in spec.split(",") if n.strip()})
    if names:
        (target / "sitecustomize.py").write_text(BLOCKER.format(names=names))
        log(f"blocked for this check: {', '.join(names)} (SITE/sitecustomize.py)")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheels", default=str(Path(__file__).resolve().parent / "gpu_wheels"))
    ap.add_argument("--target", help="the temporary site dir (created)")
    ap.add_argument("--no-pip", action="store_true", help="unpack the wheels even where pip exists")
    ap.add_argument("--requirements", action="store_true", help="print the requirements to download, one a line")
    ap.add_argument("--with-dagster", action="store_true", help="with --requirements: Dagster too")
    ap.add_argument("--log", default="", help="append what is done to this file")
    ap.add_argument("--block", default="", help="comma list of top-level modules made unimportable in every process "
                                                "that has SITE on its path (a sitecustomize.py there): e.g. "
                                                "dagster,openai,optuna,sqlalchemy, as on the lent GPU machine")
    ap.add_argument("--project", default=str(Path(__file__).resolve().parent.parent),
                    help="the tree whose pyproject.toml metadata is written when it is not installed")
    args = ap.parse_args(argv)
    if args.requirements:
        print("\n".join(REQUIRED + OPTIONAL + (DAGSTER if args.with_dagster else ())))
        return 0
    if not args.target:
        ap.error("--target is required")

    lines: list[str] = []

    def log(msg: str) -> None:
        lines.append(msg.rstrip())
        print(msg.rstrip(), file=sys.stderr)

    t0 = time.perf_counter()
    wheels, target = Path(args.wheels), Path(args.target)
    target.mkdir(parents=True, exist_ok=True)
    reqs = wanted(wheels)
    status = {r: satisfied(r) for r in reqs}
    missing = [r for r, (ok, _) in status.items() if not ok]
    for r, (ok, have) in status.items():
        log(f"{r}: {'this Python has ' + have if ok else 'missing' if have is None else 'too old: ' + have}")
    method = "none needed"
    kept: dict[str, str] = {}
    if missing:
        if not wheels.is_dir() or not any(wheels.glob("*.whl")):
            raise SystemExit(f"gpu_site: {', '.join(missing)} missing here and no wheels in {wheels}: run "
                             "scripts/fetch_gpu_wheels.sh on a machine with an index and carry that folder")
        if not args.no_pip and _pip_available(sys.executable):
            method = "pip --target"
            install_with_pip(missing, wheels, target, log)
        else:
            method = "unpacked (no pip)"
            kept.update(install_by_unpacking(missing, wheels, target, log))
        kept.update(prune(target, missing, log))
    tree = tree_metadata(Path(args.project), target, log)
    blocked = write_blocker(target, args.block, log)
    installed = {_canon(d.metadata["Name"]): d.version for d in metadata.distributions(path=[str(target)])
                 if not (tree.get("written") and _canon(d.metadata["Name"]) == _canon(tree["name"]))}
    record = {"python": sys.version.split()[0], "executable": sys.executable, "wheels": str(wheels),
              "target": str(target), "method": method, "requirements": reqs, "missing": missing,
              "installed": dict(sorted(installed.items())), "tree_metadata": tree,
              "blocked": blocked, "machine_has": {**{_canon(_req(r).name): h for r, (ok, h) in status.items() if ok}, **kept},
              "seconds": round(time.perf_counter() - t0, 2)}
    (target / RECORD_NAME).write_text(json.dumps(record, indent=2))
    if args.log:
        with open(args.log, "a") as fh:
            fh.write("\n".join(lines) + "\n" + json.dumps(record) + "\n")
    log(f"site {target}: installed {', '.join(f'{k} {v}' for k, v in installed.items()) or 'nothing'} ({method})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
