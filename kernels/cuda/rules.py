"""The decision on a patched CUDA family before it compiles: ``patch_findings`` preprocesses every unit of
the variant twice under confinement (the unpatched files and the patched copy, ``nvcc -E`` with the
compile's arch, flags and macros) and applies ``kernels.cuda.tokens``' rules to the tokens:

1. no ``#line`` directive in a patched ``.cu`` file (read as the preprocessor reads it);
2. every file the line markers name lies in the family's sources, the toolkit or the system headers
   (anything else is named, never quoted, and nothing compiles);
3. no timer, SM identity, special-register read in inline asm, environment, file, process, dynamic-loading
   or system call in the family's own tokens;
4. outside the ``kernel_functions`` the tokens are the unpatched unit's, token for token.

Each finding is ``(rule, file, line, message)``. No Dagster, no torch.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from kernels.compile import CompileError
from kernels.cuda import confine, tokens
from kernels.cuda.nvcc import nvcc_path, preprocess_unit, sources_root
from kregress.core.cuda_source import kernel_regions, sources_hash
from kregress.core.family import CudaFamily, CudaUnit

WRAPPER = "<unit wrapper>"
# gcc's and cudafe's words for an #include it cannot open (the path is the patch's own text, never the file's)
_MISSING = re.compile(r"(?:([^\s|:]+):(\d+): )?(?:fatal error: |catastrophic error: cannot open source file \")"
                      r"([^\s\"]+?)(?::? No such file or directory|\")")


class _Unit:
    """One preprocessed unit: its tokens and how to name the files they come from."""

    def __init__(self, pp: Any, root: Path):
        self.pp, self.root = pp, os.path.normpath(str(root))

    def label(self, file: str) -> str | None:
        """The family file's path relative to the sources root, ``WRAPPER``, or None (a header)."""
        if file == self.pp.wrapper:
            return WRAPPER
        norm = os.path.normpath(file)
        if norm.startswith(self.root + "/"):
            return norm[len(self.root) + 1:]
        return None

    def wanted(self, file: str) -> bool:
        return self.label(file) is not None


def _regions(family: CudaFamily, root: Path, source_dir: Path | None) -> dict[str, list[tuple[int, int]]]:
    """{label of each .cu file: [(first, last line) of each kernel function]} as the files under ``root`` hold them."""
    out = {}
    mod_dir = Path(source_dir).resolve() if source_dir is not None else Path(family.module.__file__).resolve().parent
    for rel in family.cuda_sources:
        f = (mod_dir / rel).resolve()
        label = os.path.relpath(f, root)
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        out[label] = [(r.start, r.end) for r in kernel_regions(text, label, tuple(family.kernel_functions))]
    return out


class _Named:
    def __init__(self, wrapper: str):
        self.wrapper = wrapper


_BASELINES: dict[tuple, tuple[list[tokens.Tok], str]] = {}


def _baseline(family: CudaFamily, unit: CudaUnit, arch: str) -> tuple[list[tokens.Tok], str]:
    """The unpatched unit's tokens and wrapper name (kept per process, keyed by the family's files' hash)."""
    key = (family.name, unit, arch, sources_hash(family.cu_files()), tuple(family.nvcc_flags))
    if key not in _BASELINES:
        pp = preprocess_unit(family, unit, arch)
        u = _Unit(pp, sources_root(family))
        _BASELINES[key] = (tokens.tokenize(pp.text, u.wanted), pp.wrapper)
    return _BASELINES[key]


def patch_findings(family: CudaFamily, units: list[CudaUnit], arch: str, source_dir: Path) -> list[tuple[str, str, int | None, str]]:
    """Every rule the patched copy (module folder ``source_dir``) breaks, over every unit of the variant.
    Raises ``CompileError`` when the preprocessor fails (its message safe to record) or confinement is missing."""
    out: list[tuple[str, str, int | None, str]] = []
    root = sources_root(family, source_dir)
    for rel in family.cuda_sources:
        f = (Path(source_dir) / rel).resolve()
        out += tokens.directive_findings(f.read_text(encoding="utf-8", errors="replace"), os.path.relpath(f, root))
    if out:
        return out
    nvcc = nvcc_path()
    allowed = confine.header_roots(nvcc)
    new_regions = _regions(family, root, source_dir)
    base_root = sources_root(family)
    base_regions = _regions(family, base_root, None)
    for unit in units:
        try:
            pp = preprocess_unit(family, unit, arch, source_dir)
        except CompileError as exc:
            missing = _MISSING.findall(exc.detail)
            if missing:  # confinement hid it: a file outside the family, the toolkit and the system headers
                return [("include", f or "-", int(n) if n else None,
                         f"includes {m!r}: outside the family's sources, the CUDA toolkit and the compiler's system "
                         f"headers (nvcc runs confined and cannot see it)") for f, n, m in dict.fromkeys(missing)]
            raise
        out += tokens.include_findings(tokens.marker_files(pp.text), allowed, [root], {pp.wrapper})
        if out:  # nothing of a file outside is tokenized, let alone quoted; the #include's own line is named
            sites = tokens.include_sites(pp.text)
            u = _Unit(pp, root)
            placed = []
            for rule, _f, _n, msg in out:
                inc = msg.split("'")[1] if "'" in msg else ""
                by, line = sites.get(inc, ("", 0))
                lab = u.label(by) if by else None
                placed.append((rule, lab or "-", line if lab else None, msg))
            return placed
        u = _Unit(pp, root)
        try:
            new = tokens.tokenize(pp.text, u.wanted)
        except tokens.RelabelError as exc:
            return [("line_directive", "-", None, str(exc))]

        def own(f: str, u: _Unit = u) -> str | None:
            lab = u.label(f)
            return lab if lab != WRAPPER else None

        out += tokens.token_findings(new, own)
        base_toks, base_wrapper = _baseline(family, unit, arch)

        base_label = _Unit(_Named(base_wrapper), base_root).label
        out += tokens.outside_findings(tokens.outside_stream(base_toks, base_label, base_regions),
                                       tokens.outside_stream(new, u.label, new_regions), base_label, u.label)
        if out:
            return out
    return out
