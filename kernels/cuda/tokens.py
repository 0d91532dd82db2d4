"""The rules a patch to a CUDA family's ``.cu`` files is held to, read off nvcc's preprocessed translation
unit (``nvcc -E``, line markers kept, the same arch, flags and macros as the compile), so that they hold
whatever macros, token pasting, digraphs, comments or split string literals were used to write the code.
Pure: no nvcc run here (``kernels.cuda.nvcc.preprocess_unit`` makes the text).

- ``tokenize``: a small C/C++ tokenizer over preprocessed text (identifiers, pp-numbers, string and char
  literals, raw strings, punctuators with digraphs spelled canonically), each token with the file and line
  the line markers (``# 12 "file" 1``) give it.
- ``include_findings``: every file the markers name resolves inside the family's own sources, the CUDA
  toolkit or the host compiler's system headers; anything else is named (never quoted).
- ``token_findings``: in the family's own files, no timer or SM identity (``clock``, ``clock64``, ``__clock*``,
  ``%globaltimer``, ``%clock*``, ``%smid``, ``%nsmid``, ``%gridid``, any special register in an inline-asm
  string after adjacent literals are joined and escapes decoded) and no environment, file, process or
  dynamic-loading call.
- ``outside_findings``: outside the editable region (the family's ``kernel_functions``), the token stream is
  the unpatched unit's, token for token, headers and the instantiating wrapper included: a ``#define`` in
  the region that rewrites a helper outside it changes the helper's expansion and is refused.
- ``directive_findings``: no ``#line`` (or GCC's ``# 12 "file"``) in a patched file: it would relabel the
  markers the rules read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

DIGRAPHS = {"<%": "{", "%>": "}", "<:": "[", ":>": "]", "%:": "#", "%:%:": "##"}
_PUNCT = sorted(["%:%:", "...", "<<=", ">>=", "->*", "<=>", "::", "->", "++", "--", "<<", ">>", "<=", ">=", "==", "!=",
                 "&&", "||", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "##", ".*", "<%", "%>", "<:", ":>", "%:"],
                key=len, reverse=True)
_TOKEN = re.compile(
    r"(?P<nl>\n)|(?P<ws>[ \t\r\f\v]+|\\\n)"
    r"|(?P<raw>(?:u8|u|U|L)?R\"(?P<delim>[^()\\\s\"]{0,16})\()"
    r"|(?P<str>(?:u8|u|U|L)?\"(?:[^\"\\\n]|\\.)*\"(?:[A-Za-z_]\w*)?)"
    r"|(?P<chr>(?:u8|u|U|L)?'(?:[^'\\\n]|\\.)*'(?:[A-Za-z_]\w*)?)"
    r"|(?P<num>\.?\d(?:[eEpP][+-]|'(?=\w)|[\w.])*)"
    r"|(?P<id>[A-Za-z_$][\w$]*)"
    r"|(?P<punct>" + "|".join(re.escape(p) for p in _PUNCT) + r"|.)", re.S)
_MARKER = re.compile(r'[ \t]*#[ \t]*(?:line[ \t]+)?(\d+)[ \t]+"((?:[^"\\\n]|\\.)*)"([ \t\d]*)$', re.M)


@dataclass(frozen=True)
class Tok:
    kind: str  # id, num, str, chr, punct
    text: str  # digraphs spelled canonically
    file: str  # as the line marker names it
    line: int


def _unescape_marker(name: str) -> str:
    return re.sub(r"\\(.)", r"\1", name)


def _tokens_of(text: str, file: str, line: int, out: list[Tok]) -> bool:
    """Append the tokens of ``text`` (one marker's segment) to ``out``; False when a raw string does not
    close inside it (a raw string holding a line marker is a relabelling attempt)."""
    i, n = 0, len(text)
    while i < n:
        m = _TOKEN.match(text, i)
        kind = m.lastgroup
        if kind == "nl" or kind == "ws":
            line += m.group(0).count("\n")
            i = m.end()
            continue
        if kind in ("raw", "delim"):
            delim = m.group("delim") or ""
            close = text.find(")" + delim + '"', m.end())
            if close < 0:
                return False
            end = close + len(delim) + 2
            out.append(Tok("str", text[i:end], file, line))
            line += text.count("\n", i, end)
            i = end
            continue
        tok = m.group(0)
        if kind == "punct":
            tok = DIGRAPHS.get(tok, tok)
        out.append(Tok(kind, tok, file, line))
        i = m.end()
    return True


class RelabelError(ValueError):
    """A raw string literal that spans a line marker."""


def tokenize(text: str, wanted=None) -> list[Tok]:
    """Tokens of preprocessed text, each with the file and line its line markers give it. Segments of a
    file ``wanted(file)`` refuses (the headers) are one ``hdr`` token each: a digest of their text, compared
    whole (tokenizing 280,000 tokens of ``cuda_runtime.h`` would take seconds). Raises ``RelabelError`` when
    a raw string literal does not close inside its segment."""
    import hashlib

    out: list[Tok] = []
    marks = list(_MARKER.finditer(text))
    bounds = [(0, "<unknown>", 1)] + [(m.end() + 1, _unescape_marker(m.group(2)), int(m.group(1))) for m in marks]
    ends = [m.start() for m in marks] + [len(text)]
    for (start, file, line), end in zip(bounds, ends):
        seg = text[start:end] if start < end else ""
        if not seg.strip():
            continue
        if wanted is None or wanted(file):
            if not _tokens_of(seg, file, line, out):
                raise RelabelError(f"a raw string literal in {file} line {line} spans a line marker")
        else:
            digest = hashlib.sha1(" ".join(seg.split()).encode(errors="replace")).hexdigest()[:16]
            out.append(Tok("hdr", digest, file, line))
    return out


# --- string literals -------------------------------------------------------------------------------

_SIMPLE_ESC = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "\\": "\\", "'": "'",
               '"': '"', "?": "?", "0": "\0"}


def literal_value(tok: str) -> str:
    """The characters a string literal holds: prefix, quotes and ud-suffix dropped, escapes decoded
    (``\\x25`` and ``\\045`` are both ``%``)."""
    m = re.match(r'(?:u8|u|U|L)?R"([^()\\\s"]{0,16})\((.*)\)\1"', tok, re.S)
    if m:
        return m.group(2)
    m = re.match(r'(?:u8|u|U|L)?"(.*)"', tok, re.S)
    body = m.group(1) if m else tok
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\" or i + 1 >= len(body):
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt == "x":
            h = re.match(r"[0-9A-Fa-f]+", body[i + 2:])
            out.append(chr(int(h.group(0), 16) % 0x110000) if h else "x")
            i += 2 + (len(h.group(0)) if h else 0)
        elif nxt in "01234567":
            o = re.match(r"[0-7]{1,3}", body[i + 1:]).group(0)
            out.append(chr(int(o, 8)))
            i += 1 + len(o)
        elif nxt in "uU":
            width = 4 if nxt == "u" else 8
            h = body[i + 2:i + 2 + width]
            try:
                out.append(chr(int(h, 16)))
            except ValueError:
                out.append(nxt)
            i += 2 + width
        else:
            out.append(_SIMPLE_ESC.get(nxt, nxt))
            i += 2
    return "".join(out)


def joined_strings(toks: list[Tok]) -> list[tuple[Tok, str]]:
    """Adjacent string literals joined (translation phase 6): (the first token, the joined value)."""
    out: list[tuple[Tok, str]] = []
    run: list[Tok] = []
    for t in toks + [Tok("punct", "", "", 0)]:
        if t.kind == "str":
            run.append(t)
            continue
        if run:
            out.append((run[0], "".join(literal_value(r.text) for r in run)))
            run = []
    return out


# --- the rules --------------------------------------------------------------------------------------

# (rule, identifiers refused wherever they appear, identifiers refused when called, what it reaches for)
TIMER = ("timer", re.compile(r"^(clock|clock64|__clock\w*|\w*globaltimer\w*|clock_gettime|gettimeofday|__rdtsc\w*|rdtsc|"
                             r"chrono|steady_clock|system_clock|high_resolution_clock|__builtin_readcyclecounter|"
                             r"__builtin_ia32_rdtsc\w*|get_sreg_\w+)$"),
         "a timer or a special register (a kernel that reads the clock can tell it is being timed; "
        "cuda::ptx::get_sreg_* reads %smid, %globaltimer and the like)")
CALLS: tuple[tuple[str, re.Pattern, str], ...] = (
    ("environment", re.compile(r"^(getenv|secure_getenv|setenv|putenv|unsetenv|clearenv|environ|__environ)$"),
     "the environment"),
    ("host_io", re.compile(r"^(fopen|fopen64|freopen|fdopen|open|open64|openat|openat2|creat|opendir|readlink|"
                           r"ifstream|ofstream|fstream|filebuf|mmap|mmap64|remove|unlink|rename|truncate)$"), "files"),
    ("process", re.compile(r"^(system|popen|fork|vfork|clone|clone3|execl|execlp|execle|execv|execvp|execvpe|execve|"
                           r"fexecve|posix_spawn|posix_spawnp|kill|ptrace|raise|abort|exit|_exit|quick_exit)$"),
     "processes"),
    ("dynamic_loading", re.compile(r"^(dlopen|dlmopen|dlsym|dlvsym|dladdr)$"), "dynamic loading"),
    ("syscall", re.compile(r"^(syscall|__syscall|socket|connect|bind|listen|accept|sendto|recvfrom|getaddrinfo|"
                           r"gethostbyname|ioctl)$"), "system calls or sockets"),
)
# PTX special registers (PTX ISA, "Special Registers"): any of them read in an inline-asm string is refused.
SPECIAL_REG = re.compile(r"%%?(tid|ntid|laneid|warpid|nwarpid|ctaid|nctaid|smid|nsmid|gridid|is_explicit_cluster|clusterid|"
                         r"nclusterid|cluster_\w+|lanemask_\w+|clock\w*|pm\d\w*|envreg\d+|globaltimer\w*|reserved_smem\w*|"
                         r"total_smem_size|aggr_smem_size|dynamic_smem_size|current_graph_exec)\b")
# ... and those that tell time or which SM a block landed on, in any string literal at all.
TIMER_REG = re.compile(r"%%?(clock\w*|globaltimer\w*|smid|nsmid|gridid|pm\d\w*|envreg\d+)\b")
ASM = {"asm", "__asm", "__asm__"}


def _asm_strings(toks: list[Tok]) -> list[tuple[Tok, str]]:
    """The joined string literals inside every ``asm (...)`` statement of ``toks``."""
    out: list[tuple[Tok, str]] = []
    i = 0
    while i < len(toks):
        if toks[i].kind == "id" and toks[i].text in ASM:
            j = i + 1
            while j < len(toks) and toks[j].kind == "id" and toks[j].text in ("volatile", "__volatile__", "__volatile",
                                                                              "goto", "inline"):
                j += 1
            if j < len(toks) and toks[j].text == "(":
                depth, k = 0, j
                while k < len(toks):
                    depth += toks[k].text == "("
                    depth -= toks[k].text == ")"
                    if depth == 0:
                        break
                    k += 1
                out += joined_strings(toks[j + 1:k])
                i = k
        i += 1
    return out


def token_findings(toks: list[Tok], family_file) -> list[tuple[str, str, int, str]]:
    """(rule, file, line, message) for each timer, SM identity, environment, file, process, dynamic-loading
    or system call in the tokens whose file ``family_file(file)`` names (returns the name to report, or None)."""
    out: list[tuple[str, str, int, str]] = []
    mine = [(t, family_file(t.file)) for t in toks]
    own = [t for t, f in mine if f]
    label = {t.file: f for t, f in mine if f}
    for k, t in enumerate(own):
        if t.kind != "id":
            continue
        called = k + 1 < len(own) and own[k + 1].text == "("
        if TIMER[1].match(t.text):
            out.append((TIMER[0], label[t.file], t.line, f"{t.text!r}: {TIMER[2]}"))
            continue
        for rule, pat, what in CALLS:
            if pat.match(t.text) and (called or rule in ("environment", "dynamic_loading")):
                out.append((rule, label[t.file], t.line, f"{t.text!r}{' called' if called else ''}: reaches for {what}"))
                break
    asm = _asm_strings(own)
    asm_ids = {id(first) for first, _ in asm}
    for first, value in asm:
        m = SPECIAL_REG.search(value)
        if m:
            out.append(("special_register", label[first.file], first.line,
                        f"inline asm reads the special register {m.group(0).lstrip('%')!r} (timers, SM identity and "
                        f"other special registers are refused; written as {value.strip()[:80]!r})"))
    for first, value in joined_strings(own):
        if id(first) in asm_ids:
            continue
        m = TIMER_REG.search(value)
        if m:
            out.append(("special_register", label[first.file], first.line,
                        f"a string names the special register {m.group(0).lstrip('%')!r} (a timer or SM identity)"))
    return out


def include_findings(toks_files: set[str], allowed_roots: list[Path], family_roots: list[Path],
                     trusted: set[str]) -> list[tuple[str, str, int | None, str]]:
    """Every file the line markers name that is none of ``trusted`` (the wrapper, ``<built-in>``) and lies
    outside ``family_roots`` and ``allowed_roots`` (the toolkit, system headers): the path only."""
    out = []
    roots = [os.path.normpath(str(r)) for r in list(family_roots) + list(allowed_roots)]
    for f in sorted(toks_files):
        if f in trusted or (f.startswith("<") and f.endswith(">")):
            continue
        norm = os.path.normpath(f)
        if not os.path.isabs(norm) or not any(norm == r or norm.startswith(r.rstrip("/") + "/") for r in roots):
            out.append(("include", "-", None, f"includes {f!r}: outside the family's sources, the CUDA toolkit and the "
                                              f"compiler's system headers (its text is not read into any record)"))
    return out


def include_sites(text: str) -> dict[str, tuple[str, int]]:
    """{file entered by a line marker: (the file that included it, the line of the #include)}: read off the
    marker that returns from it (``# 76 "k.cu" 2`` after an include on line 75)."""
    out: dict[str, tuple[str, int]] = {}
    stack: list[str] = []
    for m in _MARKER.finditer(text):
        name, flags = _unescape_marker(m.group(2)), m.group(3).split()
        if "1" in flags:
            stack.append(name)
        elif "2" in flags and stack:
            left = stack.pop()
            out.setdefault(left, (name, int(m.group(1)) - 1))
    return out


def marker_files(text: str) -> set[str]:
    """Every file a line marker of ``text`` names."""
    return {_unescape_marker(m.group(2)) for m in _MARKER.finditer(text)}


_DIRECTIVE = re.compile(r"^[ \t]*(?:#|%:|\?\?=)[ \t]*(\w+)", re.M)


def directive_lines(source: str) -> list[tuple[int, str]]:
    """(physical line, directive name) of every preprocessing directive of ``source``, read as the
    preprocessor does: line splices joined, comments replaced by a space, digraph and trigraph ``#``."""
    phys: list[int] = []
    logical = []
    line = 1
    i = 0
    while i < len(source):
        if source.startswith("\\\n", i):
            line += 1
            i += 2
            continue
        if source.startswith("??/\n", i):
            line += 1
            i += 4
            continue
        logical.append(source[i])
        phys.append(line)
        if source[i] == "\n":
            line += 1
        i += 1
    text = "".join(logical)
    # comments to one space (a block comment's newlines kept so logical lines stay put), strings kept intact
    buf, k, n = [], 0, len(text)
    while k < n:
        c = text[k]
        if text.startswith("//", k):
            j = text.find("\n", k)
            j = n if j < 0 else j
            buf.append(" " * (j - k))
            k = j
        elif text.startswith("/*", k):
            j = text.find("*/", k + 2)
            j = n if j < 0 else j + 2
            buf.append("".join("\n" if ch == "\n" else " " for ch in text[k:j]))
            k = j
        elif c in "\"'":
            j = k + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            buf.append(text[k:j + 1])
            k = j + 1
        else:
            buf.append(c)
            k += 1
    clean = "".join(buf)
    out = []
    for m in _DIRECTIVE.finditer(clean):
        pos = m.start()
        out.append((phys[min(pos, len(phys) - 1)] if phys else 1, m.group(1)))
    return out


def directive_findings(source: str, file: str) -> list[tuple[str, str, int, str]]:
    """A ``#line`` directive (or GCC's ``# 12 "file"``) in a patched file: it would relabel the markers."""
    return [("line_directive", file, n, f"a #{name} directive relabels the preprocessor's line markers, which the rules "
                                        f"read: not allowed in a patch")
            for n, name in directive_lines(source) if name == "line" or name.isdigit()]


def outside_stream(toks: list[Tok], family_file, regions: dict[str, list[tuple[int, int]]]) -> list[Tok]:
    """The tokens outside the editable region: every token of a header or the wrapper, and the tokens of
    the family's files on lines outside ``regions`` ({family label: [(start, end)]})."""
    out = []
    for t in toks:
        f = family_file(t.file)
        if f and any(a <= t.line <= b for a, b in regions.get(f, ())):
            continue
        out.append(t)
    return out


def _enclosing(toks: list[Tok], k: int, family_file) -> str | None:
    """The function of the family's file that token ``k`` lies in: the last ``name (`` seen at brace depth 0."""
    depth, name = 0, None
    for j in range(min(k, len(toks))):
        t = toks[j]
        if not family_file(t.file):
            continue
        if t.text == "{":
            depth += 1
        elif t.text == "}":
            depth = max(0, depth - 1)
        elif depth == 0 and t.kind == "id" and j + 1 < len(toks) and toks[j + 1].text == "(":
            name = t.text
    return name


def outside_findings(base: list[Tok], new: list[Tok], base_file, new_file) -> list[tuple[str, str, int | None, str]]:
    """Where the patched unit's tokens outside the region first differ from the unpatched unit's. A family
    file's tokens are shown; a header's position is named only."""
    def key(t: Tok, ff) -> tuple[str, str]:
        f = ff(t.file)
        return (f or os.path.normpath(t.file), t.text)

    n = min(len(base), len(new))
    for k in range(n + 1):
        if k < n and key(base[k], base_file) == key(new[k], new_file):
            continue
        if k == n and len(base) == len(new):
            return []
        t = new[k] if k < len(new) else (new[-1] if new else None)
        b = base[k] if k < len(base) else None
        where_f = new_file(t.file) if t else None
        shown_new = " ".join(x.text for x in new[k:k + 8] if new_file(x.file)) if where_f else ""
        shown_old = " ".join(x.text for x in base[k:k + 8] if base_file(x.file)) if b and base_file(b.file) else ""
        what = (f": unpatched {shown_old!r}, patched {shown_new!r}" if shown_old or shown_new else "")
        if where_f:
            fn = _enclosing(new, k, new_file)
            return [("outside_region", where_f, t.line, f"{fn or 'code'} (outside the kernel functions) preprocesses to "
                                                         f"other tokens than unpatched{what} (a macro or directive in "
                                                         f"the region changes code outside it)")]
        place = f"in {os.path.basename(t.file)} line {t.line}" if t else "at the end of the unit"
        return [("outside_region", "-", None, f"the preprocessed code outside the kernel functions differs from the "
                                              f"unpatched unit's {place} (an #include or macro in the region)")]
    return []
