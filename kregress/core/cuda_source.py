"""CUDA C++ sources as data: the toolchain's whereabouts, kernel regions, the hash of what nvcc reads,
and the static advice on a patch to a ``.cu`` file. Pure: no torch, no Triton, no Dagster; nvcc is
only looked for here, never run.

- ``find_nvcc`` / ``nvcc_problem``: where nvcc is (``$KREGRESS_NVCC``, ``PATH``, ``$CUDA_HOME/bin``, the
  ``nvidia-cuda-nvcc`` wheel), or the one line that says how to get it (``NVCC_HINT``).
- ``kernel_regions``: the line spans of named ``__global__`` / ``__device__`` functions in a ``.cu`` file
  (their ``template <...>`` head included), found by scanning tokens with comments and strings blanked.
- ``local_headers`` / ``sources_hash``: every ``#include "..."`` reachable from the family's ``.cu`` files,
  so an edit to a header recompiles.
- ``advice``: what added C++ lines reach for, read per line on raw text (host I/O, processes, sockets, the
  environment, timers, inline system calls). No longer the CUDA judge's decision: a macro, token pasting or a
  split literal walks around a per-line regex, so the judge's rules read nvcc's preprocessed tokens
  (``kernels.cuda.rules``) and nvcc and the GPU child run confined (``kernels.cuda.confine``; docs/cuda.md).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

NVCC_HINT = ("no nvcc found (looked at $KREGRESS_NVCC, PATH, $CUDA_HOME/bin and the nvidia-cuda-nvcc wheel): install the "
             "CUDA toolkit (nvcc on PATH), or `pip install -e '.[cuda]'` (the nvidia-cuda-nvcc, nvidia-cuda-crt and "
             "nvidia-cuda-cccl wheels); Triton families need neither")


def _wheel_nvcc() -> str | None:
    """nvcc from the ``nvidia-cuda-nvcc`` wheel (``site-packages/nvidia/cu13/bin/nvcc``, or ``cuda_nvcc/bin``)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        for cand in sorted(Path(root).glob("cu*/bin/nvcc"), reverse=True) + [Path(root) / "cuda_nvcc" / "bin" / "nvcc"]:
            if cand.is_file() and os.access(cand, os.X_OK):
                return str(cand)
    return None


def find_nvcc() -> str | None:
    """The nvcc this process would run, or None. Order: ``$KREGRESS_NVCC``, ``PATH``, ``$CUDA_HOME/bin``,
    the wheel."""
    explicit = os.environ.get("KREGRESS_NVCC")
    if explicit:
        return explicit if Path(explicit).is_file() and os.access(explicit, os.X_OK) else None
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    return _wheel_nvcc()


def nvcc_problem() -> str | None:
    """None when nvcc is there, else ``NVCC_HINT``: the one line a CUDA family's spec is refused with."""
    return None if find_nvcc() else NVCC_HINT


# --- scanning C++ ----------------------------------------------------------------------------------


def blank_comments_and_strings(text: str) -> str:
    """``text`` with every comment, string and char literal replaced by spaces (newlines kept), so that
    braces and names are found only in code and line numbers stay the same."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        else:
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class CudaRegion:
    """One editable span of a ``.cu`` file: a kernel function, 1-based lines, template head included."""

    file: str
    name: str
    start: int
    end: int


_QUALIFIERS = re.compile(r"__global__|__device__")


def kernel_regions(source: str, file: str, names: tuple[str, ...]) -> list[CudaRegion]:
    """The spans of the ``__global__`` / ``__device__`` function definitions named in ``names`` (every
    overload and specialisation of a name; declarations without a body are not regions)."""
    code = blank_comments_and_strings(source)
    line_of = _line_index(code)
    out: list[CudaRegion] = []
    for name in names:
        for m in re.finditer(rf"\b{re.escape(name)}\s*(?:<[^;{{}}()]*>)?\s*\(", code):
            head_start = _statement_start(code, m.start())
            head = code[head_start:m.start()]
            if not _QUALIFIERS.search(head):
                continue  # a call or a host function of the same name
            close = _match(code, m.end() - 1, "(", ")")
            if close is None:
                continue
            k = close + 1
            while k < len(code) and code[k] not in "{;":
                k += 1
            if k >= len(code) or code[k] == ";":
                continue  # a declaration
            end = _match(code, k, "{", "}")
            if end is None:
                continue
            out.append(CudaRegion(file=file, name=name, start=line_of(head_start + _leading_ws(code, head_start)),
                                  end=line_of(end)))
    return sorted(out, key=lambda r: r.start)


def _line_index(text: str):
    starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]

    def line_of(pos: int) -> int:
        import bisect

        return bisect.bisect_right(starts, pos)

    return line_of


def _leading_ws(code: str, pos: int) -> int:
    k = pos
    while k < len(code) and code[k].isspace():
        k += 1
    return k - pos


def _statement_start(code: str, pos: int) -> int:
    """Where the declaration holding ``pos`` begins: after the previous ``;``, ``{`` or ``}``, past blank and
    preprocessor lines (the template head, qualifiers and ``__launch_bounds__`` are inside)."""
    k = max(code.rfind(c, 0, pos) for c in ";{}") + 1
    while k < pos:
        eol = code.find("\n", k)
        line = code[k:eol if eol >= 0 else pos]
        if line.strip() and not line.lstrip().startswith("#"):
            break
        if eol < 0:
            break
        k = eol + 1
    return k


def _match(code: str, pos: int, open_: str, close: str) -> int | None:
    depth = 0
    for k in range(pos, len(code)):
        if code[k] == open_:
            depth += 1
        elif code[k] == close:
            depth -= 1
            if depth == 0:
                return k
    return None


_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def local_headers(files: list[Path]) -> list[Path]:
    """Every header reachable through ``#include "..."`` from ``files`` (relative to the including file),
    in discovery order; system headers (``<...>``) belong to the toolkit, whose version the cache key holds."""
    seen: dict[Path, None] = {}
    todo = [Path(f).resolve() for f in files]
    done = set(todo)
    while todo:
        f = todo.pop(0)
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for inc in _INCLUDE.findall(text):
            h = (f.parent / inc).resolve()
            if h.is_file() and h not in done:
                done.add(h)
                seen[h] = None
                todo.append(h)
    return list(seen)


def sources_hash(files: list[Path]) -> str:
    """sha256 over the names and bytes of ``files`` and their local headers."""
    h = hashlib.sha256()
    for f in list(files) + local_headers(files):
        h.update(Path(f).name.encode())
        try:
            h.update(Path(f).read_bytes())
        except OSError:
            h.update(b"missing")
    return h.hexdigest()[:16]


# --- static advice on added C++ ----------------------------------------------------------------------

# (rule, pattern over a code line with comments and strings blanked, what it reaches for)
ADVICE_RULES: tuple[tuple[str, re.Pattern, str], ...] = (
    ("host_io", re.compile(r"\b(fopen|freopen|fdopen|open|openat|creat|fread|fwrite|fprintf|fputs|fgets|fscanf|"
                           r"ifstream|ofstream|fstream|std::cout|std::cerr|read|write|unlink|remove|rename|mmap)\s*[(<]?"),
     "host file I/O"),
    ("process", re.compile(r"\b(system|popen|fork|vfork|execl|execlp|execle|execv|execvp|execve|posix_spawn|"
                           r"posix_spawnp|kill|ptrace|dlopen|dlsym)\s*\("), "processes or dynamic loading"),
    ("socket", re.compile(r"\b(socket|connect|bind|listen|accept|sendto|recvfrom|send|recv|getaddrinfo|gethostbyname)\s*\("),
     "sockets"),
    ("environment", re.compile(r"\b(getenv|secure_getenv|setenv|putenv|unsetenv|environ)\b"), "the environment"),
    ("syscall", re.compile(r"\b(syscall|__syscall)\s*\("), "raw system calls"),
    ("timer", re.compile(r"\b(clock|clock64|globaltimer|__nanosleep)\b|%globaltimer|%clock"),
     "device timers (a kernel that reads the clock can tell it is being timed)"),
)
_SYSTEM_INCLUDES = re.compile(r"^\s*#\s*include\s*<\s*(cstdio|stdio\.h|fstream|iostream|cstdlib|stdlib\.h|unistd\.h|"
                              r"fcntl\.h|sys/[\w/]+\.h|netinet/\w+\.h|arpa/\w+\.h|netdb\.h|dlfcn\.h|spawn\.h|"
                              r"filesystem|thread|signal\.h|csignal)\s*>")
_INCLUDE_ANY = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def advice(added: list[tuple[int, str]]) -> list[tuple[str, int, str]]:
    """(rule, line, message) for each added line (``(line number, text)``) that reaches for host I/O,
    processes, sockets, the environment, raw system calls, device timers, or includes a header for them.
    Comments and strings are blanked first (a ``// getenv`` note is not code)."""
    out: list[tuple[str, int, str]] = []
    for n, text in added:
        raw = text
        code = blank_comments_and_strings(text)
        if _INCLUDE_ANY.match(raw):
            m = _SYSTEM_INCLUDES.match(raw)
            inc = _INCLUDE_ANY.match(raw).group(1)
            out.append(("include" if not m else "host_io", n,
                        f"adds #include <{inc}>" + (": a header for host I/O, processes or sockets" if m else
                                                    ": a kernel patch edits the kernel functions, not the includes")))
            continue
        for rule, pat, what in ADVICE_RULES:
            m = pat.search(code)
            if m:
                out.append((rule, n, f"reaches for {what}: {m.group(0).strip()!r} in {raw.strip()[:80]!r}"))
                break
        if re.search(r"\basm\s*(volatile\s*)?\(", code) and re.search(r"syscall|trap|exit|pmevent|globaltimer|clock",
                                                                      raw):
            out.append(("inline_asm", n, f"inline PTX that traps, exits or reads a timer: {raw.strip()[:80]!r}"))
    return out


# --- a patch to .cu files: the editable region ----------------------------------------------------------


def _code_line(text: str) -> bool:
    """A line that is neither blank nor only a comment (comments outside the kernel functions are free)."""
    return bool(blank_comments_and_strings(text).strip())


def _outside_skeleton(source: str, regions: list[CudaRegion]) -> list[str]:
    """The code of ``source`` outside ``regions``, comments and blank lines dropped, whitespace normalised."""
    code = blank_comments_and_strings(source).splitlines()
    out = []
    for n, line in enumerate(code, 1):
        if any(r.start <= n <= r.end for r in regions):
            continue
        t = " ".join(line.split())
        if t:
            out.append(t)
    return out


def region_findings(files: dict[str, tuple[str, ...]], patch_files: list, old_texts: dict[str, str],
                    new_texts: dict[str, str], max_changed_lines: int, changed_lines: int) -> list[tuple[str, str, int | None, str]]:
    """Every way a patch to ``.cu`` files reaches outside the editable region, as (rule, file, line, message):
    ``files`` maps each editable ``.cu`` path (relative to the family's root, as a patch names it) to the
    kernel functions in it. A file that is not one of them, a file added, deleted or renamed, a removed
    line outside those functions in the original, an added line outside them in the patched file, a
    change to the code between them, or more changed lines than ``max_changed_lines``."""
    out: list[tuple[str, str, int | None, str]] = []
    allowed = ", ".join(sorted(files))
    if changed_lines > max_changed_lines:
        out.append(("size", patch_files[0].path if patch_files else "-", None,
                    f"{changed_lines} changed lines (added + removed) > patches.max_changed_lines {max_changed_lines}"))
    for fp in patch_files:
        if fp.status != "modified":
            out.append(("outside_region", fp.path, None, f"a {fp.status} file: only {allowed} may be modified in place"))
            continue
        if fp.path not in files:
            first = next((n for h in fp.hunks for n, _ in h.removed_old_lines()), fp.hunks[0].old_start if fp.hunks else None)
            out.append(("outside_region", fp.path, first, f"not a kernel file of this CUDA family: a patch may edit only the "
                                                          f"kernel functions of {allowed}"))
            continue
        if fp.path not in new_texts:
            continue
        names = files[fp.path]
        old_r = kernel_regions(old_texts[fp.path], fp.path, names)
        new_r = kernel_regions(new_texts[fp.path], fp.path, names)
        missing = sorted({r.name for r in old_r} - {r.name for r in new_r})
        if missing:
            out.append(("outside_region", fp.path, None, f"the patched file no longer defines {', '.join(missing)}"))

        def inside(regs: list[CudaRegion], n: int) -> bool:
            return any(r.start <= n <= r.end for r in regs)

        before = len(out)
        for h in fp.hunks:
            for n, t in h.removed_old_lines():
                if _code_line(t) and not inside(old_r, n):
                    out.append(("outside_region", fp.path, n, f"removes a line outside the kernel functions "
                                                              f"({', '.join(names)}): {t.strip()[:80]!r}"))
            for n, t in h.added_new_lines():
                if _code_line(t) and not inside(new_r, n):
                    out.append(("outside_region", fp.path, n, f"adds a line outside the kernel functions "
                                                              f"({', '.join(names)}): {t.strip()[:80]!r}"))
        if len(out) == before and _outside_skeleton(old_texts[fp.path], old_r) != _outside_skeleton(new_texts[fp.path], new_r):
            out.append(("outside_region", fp.path, None, "the code outside the kernel functions changed"))
    return out
