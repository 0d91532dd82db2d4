"""`kregress family ...`: list families, scaffold a plugin, run the conformance kit.

    kregress family list                        # built-in, installed plugins, and where each comes from
    kregress family new NAME --dir DIR          # a plugin package outside this repository
    kregress family check NAME [--spec FILE]    # one line per check; exit 1 if any fails

A plugin registers its family under the entry-point group ``kregress.families``; ``pip install -e DIR``
makes ``kernel_family: NAME`` work in any spec. Heavy imports (Triton, torch, Dagster) happen inside the
commands, never at ``--help``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from string import Template

TEMPLATES = Path(__file__).resolve().parent / "templates" / "family"
TEMPLATES_BY_KIND = {"triton": TEMPLATES, "cuda": TEMPLATES.parent / "family_cuda"}  # family new --kind
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{1,40}$")


def register(sub: argparse._SubParsersAction) -> None:
    fam = sub.add_parser("family", help="kernel families: list, scaffold a plugin (new), conformance kit (check)",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    fsub = fam.add_subparsers(dest="family_command", required=True)
    ls = fsub.add_parser("list", help="every family kregress can load, and where it comes from")
    ls.set_defaults(func=cmd_list)
    new = fsub.add_parser("new", help="scaffold a plugin family package outside this repository")
    new.add_argument("name", help="family name: lowercase letters, digits and _ (e.g. my_rowsum)")
    new.add_argument("--dir", required=True, help="where to create the package (must not exist or be empty)")
    new.add_argument("--kind", choices=sorted(TEMPLATES_BY_KIND), default="triton",
                     help="triton (a Triton jit kernel, the default) or cuda (a .cu kernel compiled by nvcc)")
    new.set_defaults(func=cmd_new)
    chk = fsub.add_parser("check", help="run the conformance checks on a family")
    chk.add_argument("name", help="a built-in family, an installed plugin or package.module:attribute")
    chk.add_argument("--spec", help="the spec to check against (default: the family's shipped spec: specs/NAME.yaml beside "
                                    "its package, else a specs/*.yaml there with kernel_family: NAME)")
    chk.set_defaults(func=cmd_check)


def scaffold(name: str, target: Path, kind: str = "triton") -> list[Path]:
    """Write the plugin package for family ``name`` into ``target``; returns the files written."""
    if not NAME_RE.match(name):
        raise ValueError(f"family name {name!r}: use 2-41 lowercase letters, digits and _, starting with a letter")
    if target.exists() and any(target.iterdir()):
        raise ValueError(f"{target} exists and is not empty: pick a new folder")
    package = f"kregress_{name}"
    values = {"name": name, "package": package, "dist": f"kregress-{name.replace('_', '-')}", "task_id": name}
    templates = TEMPLATES_BY_KIND[kind]
    layout = {
        "pyproject.toml": "pyproject.toml.tmpl",
        "README.md": "README.md.tmpl",
        f"{package}/__init__.py": "__init__.py.tmpl",
        f"{package}/family.py": "family.py.tmpl",
        f"specs/{name}.yaml": "spec.yaml.tmpl",
        f"tests/test_{name}.py": "test_family.py.tmpl",
    }
    if kind == "cuda":
        layout[f"{package}/{name}.cu"] = "kernel.cu.tmpl"
    written = []
    for rel, tmpl in layout.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template((templates / tmpl).read_text()).substitute(values))
        written.append(path)
    return written


def cmd_new(args: argparse.Namespace) -> int:
    target = Path(args.dir).expanduser().resolve()
    try:
        files = scaffold(args.name, target, getattr(args, "kind", "triton"))
    except ValueError as exc:
        print(f"kregress family new: {exc}", file=sys.stderr)
        return 2
    for f in files:
        print(f"  wrote {f.relative_to(target)}")
    print(f"family {args.name} scaffolded in {target}. Next:\n"
          f"  pip install -e {target}\n"
          f"  kregress family check {args.name}\n"
          f"  kregress sweep {target / 'specs' / (args.name + '.yaml')}\n"
          f"  kregress judge {target / 'specs' / (args.name + '.yaml')} mine.patch   # a patch to its kernel (git diff, "
          f"paths relative to {target})")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from kregress.core.family import UnknownFamily, entry_points_by_name, get_family, is_builtin

    eps = entry_points_by_name()
    for name in sorted(eps, key=lambda n: (not is_builtin(eps[n]), n)):
        ep = eps[name]
        where = "built-in" if is_builtin(ep) else f"plugin ({ep.dist.name if ep.dist else '?'})"
        try:
            fam = get_family(name)
            files = ", ".join(str(f) for f in fam.source_files()) or "-"
            print(f"{name:<20} {where:<28} {fam.kind:<9} {ep.value}  [{files}]")
        except UnknownFamily as exc:
            print(f"{name:<20} {where:<28} {'?':<9} {ep.value}  BROKEN: {exc}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from kernel_assets.conformance import run_checks
    from kregress.core.family import UnknownFamily

    try:
        checks = run_checks(args.name, args.spec, on_check=lambda c: print(c.line(), flush=True))
    except UnknownFamily as exc:
        print(f"kregress family check: {exc}", file=sys.stderr)
        return 2
    failed = [c for c in checks if not c.ok]
    if len(checks) == 1 and failed:
        print(checks[0].line())
    print(f"conformance: {len(checks) - len(failed)} of {len(checks)} checks passed or skipped" + (f", {len(failed)} FAILED" if failed else ""))
    return 1 if failed else 0
