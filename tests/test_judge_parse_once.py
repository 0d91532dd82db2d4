"""One `kregress judge` call parses and binds its spec once, parses each patch once and each kernel file once
(the parsed objects travel; nobody re-reads them). Counted in a child process that wraps the parsers before
the CLI imports them, then runs the real command; the judging children are other processes and not counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent

COUNTER = r'''
import ast, collections, functools, hashlib, json, sys
counts = collections.Counter()
real_parse = ast.parse

def parse(source, filename="<unknown>", *a, **k):
    if isinstance(source, str) and "@triton.jit" in source:  # a kernel file (the gate's reads of it)
        counts["ast:" + hashlib.sha256(source.encode()).hexdigest()[:12]] += 1
    return real_parse(source, filename, *a, **k)

ast.parse = parse
import kregress.core.bind as B
import kregress.core.patch as P
import kregress.core.spec as S

def wrap(mod, name, key, also=()):
    real = getattr(mod, name)
    def counted(*a, **k):
        counts[key] += 1
        return real(*a, **k)
    if hasattr(real, "cache_info"):  # a memo: count what reaches the parser, not the look-ups
        counted = functools.lru_cache(maxsize=64)(functools.wraps(real.__wrapped__)(
            lambda *a, _f=real.__wrapped__, **k: (counts.__setitem__(key, counts[key] + 1), _f(*a, **k))[1]))
    for m in (mod, *also):  # the module and those that imported the name from it
        setattr(m, name, counted)

wrap(S, "read_spec_file", "spec_read", also=(B,))
wrap(S, "parse_spec_data", "spec_schema", also=(B,))
wrap(B, "bind", "spec_bind")
wrap(P, "parse_patch", "patch_parse")
from kernel_assets import cli
try:
    rc = cli.main(sys.argv[1:])
finally:
    print("COUNTS " + json.dumps(counts), file=sys.stderr)
sys.exit(rc)
'''


def test_one_judge_call_parses_and_binds_once(tmp_path):
    script = tmp_path / "count.py"
    script.write_text(COUNTER)
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home")}
    # a cheat the static policy refuses inside the region: every static reader of the kernel file runs
    patch = REPO / "tests" / "redteam" / "gemm_cheat_env_sniff.patch"
    p = subprocess.run([sys.executable, str(script), "judge", "specs/gemm_smoke.yaml", str(patch)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "REGRESS rejected" in p.stdout, p.stdout
    (line,) = [x for x in p.stderr.splitlines() if x.startswith("COUNTS ")]
    counts = json.loads(line[len("COUNTS "):])
    assert counts["spec_read"] == 1 and counts["spec_schema"] == 1 and counts["spec_bind"] == 1, counts
    assert counts["patch_parse"] == 1, counts
    kernel_parses = {k: v for k, v in counts.items() if k.startswith("ast:")}
    assert kernel_parses, counts  # the counter saw the kernel files (else it counts nothing)
    # each distinct kernel text once (the baseline's file and the patched file are two texts)
    assert all(v == 1 for v in kernel_parses.values()), kernel_parses
