"""Fault scenarios, each a real `kregress sweep` process against the scripted OpenAI-compatible server
(kregress.testing.fake_gateway, 127.0.0.1 only), printed as one table.

    .venv/bin/python bench/faults.py [--only NAME ...]

Columns: exit code of the (last) sweep process; server attempts (chat requests the server saw); ledger rows
(usage rows of calls that reached the server, cache hits left out: equal to the attempts when the gateway
accounts for every attempt); paid calls on resume
(chat requests answered 200 during the resumed sweep: 0 when nothing is paid twice); budget overshoot
(tokens the server billed beyond the reservations, from the ledger); seconds (wall time of the scenario).
Every scenario uses its own fresh DAGSTER_HOME, seeded with a compile cache from one warm-up sweep so that
the table measures the faults, not Triton compiles. Bounded: each process has a time limit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from kregress.testing.fake_gateway import FakeOpenAI, Reply  # noqa: E402

LIMIT_S = 600
KEYS = {"TAOTOKEN_KEY_SUGGEST": "sk" "-FAULTBENCH-suggest-11112222333344445555,sk" "-FAULTBENCH-suggest-66667777888899990000",
        "TAOTOKEN_KEY_REPORT": "sk" "-FAULTBENCH-report-aaaabbbbccccddddeeee"}
BASELINE = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4)
PROPOSAL = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_stages=2, num_warps=4)


def spec(task_id: str, strategy: str = "llm") -> dict:
    return {
        "task_id": task_id, "kernel_family": "gemm", "dtype": "fp16",
        "shape_matrix": [{"M": 256, "N": 256, "K": 256}], "correctness_shapes": [{"M": 40, "N": 24, "K": 40}],
        "search": {"strategy": strategy, "variants_per_round": 1, "max_rounds": 1, "no_improve_rounds": 1, "seed": 1},
        "budget": {"max_input_tokens_per_round": 4000, "max_output_tokens_per_round": 2000, "max_total_tokens": 20000},
        "benchmark": {"timeout_s": 120}, "baseline": BASELINE,
    }


def suggestion(seen, **usage) -> Reply:
    from kernel_assets.agent.prompt import SUGGEST_SYSTEM_PROMPT

    if seen.body["messages"][0]["content"] == SUGGEST_SYSTEM_PROMPT:
        items = [{"variant_id": "llm_r1_0", "config": PROPOSAL, "patch_summary": "wider N tile",
                  "expected_effect": "fewer blocks", "risk": "low"}]
        return Reply(content="```json\n" + json.dumps(items) + "\n```", **usage)
    return Reply(content="One round on the interpreter: latency verdicts need cuda evidence.", **usage)


class Scenario:
    def __init__(self, root: Path, seed_cache: Path | None, name: str):
        self.name = name
        self.home = root / name / "home"
        self.home.mkdir(parents=True)
        shutil.copy(REPO / "dagster_home" / "dagster.yaml", self.home)
        if seed_cache is not None and seed_cache.exists():
            shutil.copytree(seed_cache, self.home / "cache")
        self.dir = root / name

    def spec_file(self, task_id: str, strategy: str = "llm") -> Path:
        p = self.dir / f"{task_id}.yaml"
        p.write_text(yaml.safe_dump(spec(task_id, strategy)))
        return p

    def sweep(self, spec_file: Path, srv: FakeOpenAI | None, *extra: str, kill_at: str = "") -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TAOTOKEN_", "KREGRESS_"))}
        env.update(DAGSTER_HOME=str(self.home), TRITON_DEFAULT_FP_FUSION="1", **KEYS)
        if srv is not None:
            env.update(TAOTOKEN_BASE_URL=srv.root, TAOTOKEN_MODEL_ID="kregress-test-model")
        if kill_at:
            env["KREGRESS_TEST_KILL_AT"] = kill_at
        return subprocess.run([sys.executable, "-m", "kernel_assets.cli", "sweep", str(spec_file), "--force", *extra],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=LIMIT_S)

    def ledger_numbers(self) -> tuple[int, int]:
        from resources.ledger import Ledger

        path = self.home / "ledger.sqlite"
        if not path.exists():
            return 0, 0
        ledger = Ledger(path)
        rows = [r for r in ledger.usage.rows() if r.role in ("suggest", "report")]
        sweeps = {s for s in (getattr(r, "run_id", "") for r in rows) if s}
        over = sum(ledger.usage.overshoot(s).tokens for s in sweeps)
        self.cache_hits = sum(1 for r in rows if r.cache_hit)
        return sum(1 for r in rows if not r.cache_hit), over


def one_line(err: str) -> str:
    """The line that says what happened: a budget overshoot, a freed dead run, a failed step (its reason), a failed sweep."""
    lines = [ln.strip() for ln in err.splitlines()]
    for needle in ("EXCEEDED", "marked it failed", " FAILED round", "kregress: sweep", " FAILED "):
        for ln in lines:
            if needle in ln and (needle != "kregress: sweep" or "FAILED" in ln):
                return ln[:170]
    return (lines or [""])[-1][:170]


def run_kill_resume(sc: Scenario, srv: FakeOpenAI) -> dict:
    srv.handler = suggestion
    f = sc.spec_file("fault_kill")
    # at the start of round 1's benchmark step (holding the `gpu` slot): the suggest call was answered and paid
    killed = sc.sweep(f, srv, kill_at="step:round_1_variants")
    before = len(srv.chat_requests())
    resumed = sc.sweep(f, srv)
    paid_on_resume = len(srv.chat_requests()) - before
    return {"rc": resumed.returncode, "paid_resume": paid_on_resume,
            "note": f"killed rc {killed.returncode}; " + one_line(resumed.stderr)}


def run_parallel(sc: Scenario, srv: FakeOpenAI) -> dict:
    shutil.rmtree(sc.home)  # a fresh home: not even dagster.yaml
    files = [sc.spec_file(f"fault_par_{i}", strategy="local") for i in range(4)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TAOTOKEN_", "KREGRESS_"))}
    env.update(DAGSTER_HOME=str(sc.home), TRITON_DEFAULT_FP_FUSION="1")
    procs = [subprocess.Popen([sys.executable, "-m", "kernel_assets.cli", "sweep", str(f)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for f in files]
    outs = [p.communicate(timeout=LIMIT_S) for p in procs]
    rcs = [p.returncode for p in procs]
    return {"rc": max(rcs, key=abs), "note": f"exit codes {rcs}"
            + ("" if not any(rcs) else "; " + one_line(next(e for (o, e), rc in zip(outs, rcs) if rc)))}


def run_over_reporting(sc: Scenario, srv: FakeOpenAI) -> dict:
    srv.handler = lambda seen: suggestion(seen, prompt_tokens=16000)  # 4x the round's input budget
    r = sc.sweep(sc.spec_file("fault_over"), srv)
    return {"rc": r.returncode, "note": one_line(r.stderr)}


def run_misclassified_400(sc: Scenario, srv: FakeOpenAI) -> dict:
    srv.handler = lambda seen: Reply(status=400, body={"error": {
        "message": "max_tokens is too large: 999999. This model supports at most 8192 completion tokens.",
        "type": "invalid_request_error", "param": "max_tokens", "code": None}})
    r = sc.sweep(sc.spec_file("fault_400"), srv)
    line = one_line(r.stderr)
    return {"rc": r.returncode, "note": ("WRONG FIX: " if "not served" in line else "") + line}


def run_401_failover(sc: Scenario, srv: FakeOpenAI) -> dict:
    bad = KEYS["TAOTOKEN_KEY_SUGGEST"].split(",")[0]

    def handler(seen):
        if seen.token == bad:
            return Reply(status=401, body={"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                                     "param": None, "code": "invalid_api_key"}})
        return suggestion(seen)

    srv.handler = handler
    r = sc.sweep(sc.spec_file("fault_401"), srv)
    return {"rc": r.returncode, "note": one_line(r.stderr) if r.returncode else "failed over to the role's other key"}


def run_long_outage(sc: Scenario, srv: FakeOpenAI, outage_s: float = 12.0) -> dict:
    t_end = [None]

    def handler(seen):
        if t_end[0] is None:
            t_end[0] = time.monotonic() + outage_s
        if time.monotonic() < t_end[0]:
            return Reply(status=429, headers={"Retry-After": "1"}, body={"error": {"message": "Rate limit reached",
                                                                                    "type": "rate_limit_error", "code": "rate_limit_exceeded"}})
        return suggestion(seen)

    srv.handler = handler
    r = sc.sweep(sc.spec_file("fault_outage"), srv)
    return {"rc": r.returncode, "note": one_line(r.stderr) if r.returncode else f"rode out a {outage_s:.0f} s 429 outage"}


def run_kill_in_report(sc: Scenario, srv: FakeOpenAI) -> dict:
    """SIGKILL while the server holds the report call; the resume must settle it: attempts equal ledger rows."""
    import signal
    import threading

    from kernel_assets.agent.llm import NARRATIVE_SYSTEM_PROMPT

    f = sc.spec_file("fault_kill_report")
    first: dict = {}
    done = threading.Event()

    def handler(seen):
        if seen.body["messages"][0]["content"] == NARRATIVE_SYSTEM_PROMPT and not done.is_set():
            done.set()
            os.kill(first["proc"].pid, signal.SIGKILL)
            return Reply(drop=True)
        return suggestion(seen)

    srv.handler = handler
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TAOTOKEN_", "KREGRESS_"))}
    env.update(DAGSTER_HOME=str(sc.home), TRITON_DEFAULT_FP_FUSION="1", TAOTOKEN_BASE_URL=srv.root,
               TAOTOKEN_MODEL_ID="kregress-test-model", **KEYS)
    first["proc"] = subprocess.Popen([sys.executable, "-m", "kernel_assets.cli", "sweep", str(f), "--force"], cwd=REPO, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first["proc"].communicate(timeout=LIMIT_S)
    resumed = sc.sweep(f, srv)
    from resources.ledger import Ledger

    dangling = len(Ledger(sc.home / "ledger.sqlite").usage.in_flight())
    return {"rc": resumed.returncode, "note": f"killed rc {first['proc'].returncode}; {dangling} reservation(s) left open"}


def run_prose(sc: Scenario, srv: FakeOpenAI) -> dict:
    srv.handler = lambda seen: Reply(content="Try a wider tile and more stages.")
    r = sc.sweep(sc.spec_file("fault_prose"), srv)
    return {"rc": r.returncode, "note": next((ln.strip()[:170] for ln in r.stderr.splitlines() if "no usable proposal" in ln), "")}


def run_empty_choices(sc: Scenario, srv: FakeOpenAI) -> dict:
    from kernel_assets.agent.prompt import SUGGEST_SYSTEM_PROMPT

    def handler(seen):
        if seen.body["messages"][0]["content"] == SUGGEST_SYSTEM_PROMPT:
            return Reply(body={"id": "x", "object": "chat.completion", "created": 1, "model": "kregress-test-model", "choices": [],
                               "usage": {"prompt_tokens": 500, "completion_tokens": 0, "total_tokens": 500}})
        return suggestion(seen)

    srv.handler = handler
    r = sc.sweep(sc.spec_file("fault_empty_choices"), srv)
    return {"rc": r.returncode, "note": next((ln.strip()[:170] for ln in r.stderr.splitlines() if "no usable proposal" in ln), "")}


SCENARIOS = {
    "kill -9 + resume": run_kill_resume,
    "4 parallel sweeps, fresh home": run_parallel,
    "over-reporting server (4x input)": run_over_reporting,
    "misclassified 400 (max_tokens ... model)": run_misclassified_400,
    "401 on one key, failover": run_401_failover,
    "long 429 outage (12 s)": run_long_outage,
    "kill -9 during the report call + resume": run_kill_in_report,
    "prose in every round (exit 4)": run_prose,
    "empty choices list (exit 4)": run_empty_choices,
}


def warm_cache(root: Path) -> Path:
    """One local sweep: compiles the baseline and the proposal the scenarios use."""
    sc = Scenario(root, None, "_warmup")
    f = sc.spec_file("fault_warmup", strategy="local")
    r = sc.sweep(f, None)
    if r.returncode != 0:
        print(f"warm-up sweep failed (exit {r.returncode}): {one_line(r.stderr)}", file=sys.stderr)
    return sc.home / "cache"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="substrings of scenario names to run")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kregress-faults-"))
    seed = warm_cache(root)
    rows = []
    for name, fn in SCENARIOS.items():
        if args.only and not any(o in name for o in args.only):
            continue
        with FakeOpenAI() as srv:
            sc = Scenario(root, seed, name.split(" ")[0].replace("-", "") + f"_{len(rows)}")
            t0 = time.perf_counter()
            try:
                res = fn(sc, srv)
            except subprocess.TimeoutExpired:
                res = {"rc": "timeout", "note": f"did not finish within {LIMIT_S} s"}
            secs = time.perf_counter() - t0
            n_rows, over = sc.ledger_numbers() if sc.home.exists() else (0, 0)
            if getattr(sc, "cache_hits", 0):
                res["note"] = f"{sc.cache_hits} answered from the response cache; " + res.get("note", "")
            rows.append((name, res["rc"], len(srv.chat_requests()), n_rows, res.get("paid_resume", "-"), over, secs,
                         res.get("note", "")))
        print(f"  done: {name} ({secs:.0f} s)", file=sys.stderr, flush=True)
    print(f"{'scenario':<42}{'exit':>6}{'server attempts':>17}{'ledger rows':>13}{'paid on resume':>16}"
          f"{'overshoot tok':>15}{'seconds':>9}  note")
    for name, rc, att, n_rows, paid, over, secs, note in rows:
        print(f"{name:<42}{str(rc):>6}{att:>17}{n_rows:>13}{str(paid):>16}{over:>15}{secs:>9.1f}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
