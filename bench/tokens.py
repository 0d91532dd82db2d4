"""Tokens of a sweep's model calls: the suggest prompt (trimmed vs naive), the compact reply, and a whole sweep.

Builds a realistic GEMM sweep history for ``specs/gemm_h100_bf16.yaml`` (baseline + 8 variants a round, with
failures, 50 timing samples per shape, SASS mixes), runs the real llm policy through the real gateway against
the local scripted OpenAI-compatible server (``kregress.testing.fake_gateway``) for rounds 1, 2 and 3, then the
report narrative, and counts tokens as the server counts them (the usage it reports, which the ledger
records). The answers are what a well-behaved model writes in the reply schema the prompt asks for: the
compact one, with a forecast per proposal. The naive prompt (the same system prompt, then the spec and every
VariantResult as JSON) is sent through the same gateway for comparison.

    .venv/bin/python bench/tokens.py [--json OUT]

Targets (8 variants a round): round-3 suggest input <= 1,500 tokens, round-3 output <= 600, the whole sweep
(3 rounds and the report) <= 12,000; round-3 input >= 4x smaller than naive. Exit status 1 when a target is
missed. ``--json OUT`` writes ``{"round3_input_tokens", "round3_output_tokens", "sweep_total_tokens"}``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from kernel_assets.agent.base import AgentContext  # noqa: E402
from kernel_assets.agent.llm import LLMPolicy, write_narrative  # noqa: E402
from kernel_assets.agent.prompt import SUGGEST_SYSTEM_PROMPT  # noqa: E402
from kernel_assets.profile import failure_lines, row_p50, summarize_history  # noqa: E402
from kernel_assets.report import _md_table, tables  # noqa: E402
from kernel_assets.sweep import verdict_for  # noqa: E402
from kregress.core.budget import budget_scope  # noqa: E402
from kregress.core.family import get_family  # noqa: E402
from kregress.core.records import CompileStats, Correctness, Measurement, VariantResult, config_hash, config_label  # noqa: E402
from kregress.core.spec import load_spec  # noqa: E402
from kregress.testing.fake_gateway import FakeClock, FakeOpenAI, prompt_tokens_of  # noqa: E402
from resources.ledger import Ledger  # noqa: E402
from resources.taotoken import TaotokenResource, estimate_messages_tokens  # noqa: E402

TARGETS = {"round3_input_tokens": 1500, "round3_output_tokens": 600, "sweep_total_tokens": 12000}
VARIANTS_PER_ROUND = 8
SAMPLES = 50
FAILURES = {  # (round, index) -> (error, detail)
    (1, 6): ("out_of_resources", "ptxas error: Entry function 'gemm_kernel' uses too much shared data (0x3c000 bytes, 0x38c00 max)"),
    (2, 3): ("compile_failed", "triton.compiler.errors.CompilationError: at 31:14: dot operands must have matching block shapes"),
    (2, 7): ("numeric_mismatch", "max_abs_err 0.131 > atol 0.0195 at shape 257x193x131; 412 mismatches; first (0,191): 3.21 vs 3.08"),
}


def measure(cfg: dict, shape: dict, rng: random.Random, hw_tflops: float = 989.0) -> Measurement:
    m, n, k = shape["M"], shape["N"], shape["K"]
    flops = 2.0 * m * n * k
    tile = cfg["BLOCK_M"] * cfg["BLOCK_N"]
    eff = min(0.82, 0.25 + 0.45 * math.log2(tile) / 15 + 0.04 * cfg["num_stages"] - 0.03 * abs(cfg["num_warps"] - 8) / 4)
    eff *= 1.0 if cfg["GROUP_M"] > 1 else 0.9
    p50 = flops / (hw_tflops * 1e12 * max(eff, 0.05)) * 1e3
    samples = sorted(p50 * (1 + rng.gauss(0, 0.012)) for _ in range(SAMPLES))
    q = lambda f: samples[int(f * (len(samples) - 1))]  # noqa: E731
    return Measurement(shape=f"{m}x{n}x{k}", samples_ms=[round(s, 5) for s in samples], p20_ms=q(0.2), p50_ms=q(0.5), p80_ms=q(0.8),
                       tflops=flops / (q(0.5) * 1e-3) / 1e12, gbps=2.0 * (m * k + k * n + m * n) / (q(0.5) * 1e-3) / 1e9,
                       evidence="model", device="NVIDIA H100 80GB HBM3", torch_version="2.13.0", triton_version="3.9.0")


def compile_stats(cfg: dict, rng: random.Random) -> CompileStats:
    regs = min(255, 40 + cfg["BLOCK_M"] * cfg["BLOCK_N"] // (cfg["num_warps"] * 32) + rng.randint(0, 24))
    smem = (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * 2 * cfg["num_stages"]
    threads = cfg["num_warps"] * 32
    blocks = max(1, min(65536 // (regs * threads), 233472 // max(smem, 1), 2048 // threads, 32))
    mix = {"HGMMA": 64 * cfg["BLOCK_K"] // 16, "LDGSTS": 48, "LDS": 96, "STG": 32, "BAR": 12, "IMAD": 210, "FFMA": 8, "BRA": 14, "ISETP": 40}
    return CompileStats(arch="sm_90", regs_per_thread=regs, spill_bytes=0, smem_bytes=smem, num_warps=cfg["num_warps"],
                        num_stages=cfg["num_stages"], occupancy=min(1.0, blocks * cfg["num_warps"] / 64), blocks_per_sm=blocks,
                        occupancy_limiter="registers" if regs * threads * blocks > 60000 else "shared_memory",
                        sass_instructions=sum(mix.values()) * 3, sass_mix=mix, compile_seconds=round(rng.uniform(2, 9), 2))


def make_row(vid: str, rnd: int, cfg: dict, spec, rng: random.Random, failure: tuple[str, str] | None) -> VariantResult:
    cs = compile_stats(cfg, rng)
    if failure and failure[0] == "compile_failed":
        return VariantResult(variant_id=vid, round=rnd, source="llm", config=cfg, config_hash=config_hash(cfg), error=failure[0],
                             error_detail=failure[1], patch_summary="deeper pipeline", backend="model")
    corr = Correctness(ok=failure is None, max_abs_err=0.0041 if not failure else 0.131, max_rel_err=0.0087, nan_inf=False,
                       mismatches=0 if not failure else 412, tolerance=0.01, shapes_checked=["257x193x131", "64x96x256", "1x128x64"],
                       mismatch_sample="" if not failure else failure[1])
    meas = [] if failure else [measure(cfg, s, rng) for s in spec.shape_matrix]
    fc = round(rng.uniform(0.85, 1.3), 2) if rnd else None  # the forecast it was proposed with (shown in the history)
    return VariantResult(variant_id=vid, round=rnd, source="llm" if rnd else "baseline", config=cfg, config_hash=config_hash(cfg),
                         patch_summary=f"try {config_label(cfg)}", risk="medium",
                         parent="baseline", error=failure[0] if failure else None, error_detail=failure[1] if failure else "",
                         compile=cs, correctness=corr, measurements=meas, evidence="model" if meas else None, backend="model",
                         expected_speedup=fc, expected_speedup_low=fc and round(fc - 0.12, 2), expected_speedup_high=fc and round(fc + 0.15, 2))


def build_history(spec, fam, rounds: int, seed: int = 0) -> list[VariantResult]:
    rng = random.Random(seed)
    history = [make_row("baseline", 0, dict(spec.baseline), spec, rng, None)]
    space = list(fam.space.enumerate(spec.params, spec.hardware.limits))
    rng.shuffle(space)
    seen = {history[0].config_hash}
    it = iter(c for c in space if config_hash(c) not in seen)
    for rnd in range(1, rounds + 1):
        for i in range(VARIANTS_PER_ROUND):
            history.append(make_row(f"r{rnd}_v{i + 1}", rnd, next(it), spec, rng, FAILURES.get((rnd, i))))
    return history


def context(spec, fam, rnd: int) -> AgentContext:
    history = build_history(spec, fam, rnd - 1)
    obj = {r.config_hash: row_p50(r) for r in history if not r.error and r.measurements}
    return AgentContext(spec=spec, family=fam, round=rnd, n=VARIANTS_PER_ROUND, history=history, objective=obj,
                        profile_summary=summarize_history(history, spec.search.top_k), failures=failure_lines(history),
                        run_id="bench", partition=spec.task_id)


def naive_messages(ctx: AgentContext) -> list[dict[str, str]]:
    user = (
        f"Propose {ctx.n} new variants for round {ctx.round}.\nSPEC:\n{json.dumps(ctx.spec.model_dump(mode='json'), indent=1)}\n"
        f"SPACE: {ctx.family.space.describe()}\nFULL PROFILES OF EVERYTHING MEASURED:\n"
        + "\n".join(json.dumps(r.model_dump(mode="json"), indent=1) for r in ctx.history)
    )
    return [{"role": "system", "content": SUGGEST_SYSTEM_PROMPT}, {"role": "user", "content": user}]


SUMMARIES = ("deeper pipeline hides the K-loop latency", "wider N tile: fewer blocks, more reuse of A",
             "grouped order keeps B tiles in L2", "8 warps feed the larger tile", "smaller K step, less smem per stage",
             "taller M tile for the long-M shape", "fewer stages to lift occupancy", "square tile, balanced reuse")


def fake_answer(ctx: AgentContext) -> str:
    """What a well-behaved model returns: n proposals in the compact reply schema, each with a forecast."""
    out, seen = [], ctx.measured_hashes
    keys = list(ctx.family.space.params)
    rng = random.Random(ctx.round)
    for cfg in ctx.family.space.enumerate(ctx.spec.params, ctx.spec.hardware.limits):
        if config_hash(cfg) in seen or rng.random() < 0.9:
            continue
        x = round(rng.uniform(0.85, 1.35), 2)
        out.append({"id": f"r{ctx.round}_v{len(out) + 1}", "c": [cfg[k] for k in keys],
                    "x": [x, round(x - 0.12, 2), round(x + 0.15, 2)], "b": rng.choice(("compute", "memory", "latency")),
                    "s": SUMMARIES[len(out) % len(SUMMARIES)]})
        if len(out) == ctx.n:
            break
    return json.dumps(out, separators=(",", ":"))


NARRATIVE = ("No variant can be called faster or slower yet: every latency here is the analytic model's estimate from real "
             "compile stats (evidence model), so all timed variants are NEEDS_REVIEW. r1_v7 regressed as infeasible: ptxas "
             "ran out of shared memory (0x3c000 bytes for a 0x38c00 limit). r2_v4 did not compile (mismatched dot block "
             "shapes) and r2_v8 is wrong: max_abs_err 0.131 against an atol of 0.0195 on 257x193x131. The estimates favour "
             "wide N tiles with 3 to 4 stages and GROUP_M 8; re-run this sweep on an H100 (--backend cuda) to turn those "
             "estimates into PASS or REGRESS verdicts, and drop configs that need more than the 227 KiB of shared memory.")


def narrative_table(spec, fam, history: list[VariantResult]) -> str:
    """The verdict table the report role is sent (as kernel_assets/narrative.py builds it)."""
    verdicts = {r.variant_id: verdict_for(r, history[0], spec) for r in history[1:]}
    _, df, _ = tables(history, verdicts, [])
    return _md_table(df, ["variant_id", "config_label", "verdict", "ratio", "evidence", "reasons"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="OUT", help="write the three figures, as the server counts them, to OUT")
    args = ap.parse_args(argv)
    spec = load_spec(ROOT / "specs" / "gemm_h100_bf16.yaml")
    fam = get_family(spec.kernel_family)
    env = {"TAOTOKEN_KEY_SUGGEST": "sk" "-bench-not-a-real-key-000000", "TAOTOKEN_KEY_REPORT": "sk" "-bench-not-a-real-key-111111"}
    results, total = {}, 0
    scope = budget_scope("bench-sweep", spec.task_id)
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI() as srv:
        clock = FakeClock()
        g = TaotokenResource(base_url=srv.root, model_id=srv.models[0]).get_gateway(
            Ledger(Path(tmp) / "ledger.sqlite"), environ=env, sleep=clock.sleep, clock=clock, rng=random.Random(7))
        for rnd in (1, 2, 3):
            ctx = context(spec, fam, rnd)
            ctx.scope = scope
            srv.push(content=fake_answer(ctx))
            prop = LLMPolicy(g).propose(ctx)
            sent = srv.chat_requests()[-1].body
            naive = naive_messages(ctx)
            srv.push(content=fake_answer(ctx))
            g.chat("suggest", naive, use_cache=False)  # not part of the sweep: another scope
            sent_naive = srv.chat_requests()[-1].body
            total += prop.tokens.get("total", 0)
            results[rnd] = {
                "rows": len(ctx.history),
                "trimmed_est": estimate_messages_tokens(sent["messages"]),
                "trimmed_srv": prop.tokens.get("prompt", 0),
                "naive_est": estimate_messages_tokens(sent_naive["messages"]),
                "naive_srv": prompt_tokens_of(sent_naive),
                "max_tokens": sent["max_tokens"],
                "completion": prop.tokens.get("completion", 0),
                "valid": len(prop.suggestions),
                "forecasts": sum(1 for s in prop.suggestions if s.expected_speedup is not None),
            }
        history = build_history(spec, fam, 3)
        srv.push(content=NARRATIVE)
        _, source = write_narrative(g, spec, narrative_table(spec, fam, history), scope=scope)
        report = g.ledger.usage.rows(sweep=scope.sweep, role="report")
        report_in, report_out = sum(r.prompt_tokens for r in report), sum(r.completion_tokens for r in report)
        total += report_in + report_out
        sweep_rows = g.ledger.usage.rows(sweep=scope.sweep)
        assert sum(r.total_tokens for r in sweep_rows) == total, "the ledger and the replies disagree"
    print(f"gemm_h100_bf16, {VARIANTS_PER_ROUND} variants a round, top_k={spec.search.top_k}, {SAMPLES} samples per shape; "
          "tokens as the server counts them (the gateway's budget estimate beside)")
    print(f"{'round':>5} {'history':>7} {'input':>6} {'(est)':>6} {'naive':>6} {'(est)':>6} {'ratio':>6} {'output':>7} "
          f"{'max_tokens':>10} {'valid':>5} {'forecasts':>9}")
    for rnd, r in results.items():
        r["ratio"] = r["naive_srv"] / max(1, r["trimmed_srv"])
        print(f"{rnd:>5} {r['rows']:>7} {r['trimmed_srv']:>6} {r['trimmed_est']:>6} {r['naive_srv']:>6} {r['naive_est']:>6} "
              f"{r['ratio']:>5.1f}x {r['completion']:>7} {r['max_tokens']:>10} {r['valid']:>5} {r['forecasts']:>9}")
    print(f"{'report':>5} {'':>7} {report_in:>6} {'':>6} {'':>6} {'':>6} {'':>6} {report_out:>7}   ({source})")
    r3 = results[3]
    figures = {"round3_input_tokens": int(r3["trimmed_srv"]), "round3_output_tokens": int(r3["completion"]),
               "sweep_total_tokens": int(total)}
    checks = [(f"{k} {v:,} <= {TARGETS[k]:,}", v <= TARGETS[k]) for k, v in figures.items()]
    checks += [
        (f"round-3 input {r3['ratio']:.1f}x smaller than naive (>= 4x)", r3["ratio"] >= 4.0),
        (f"every proposal carries a forecast ({sum(r['forecasts'] for r in results.values())} of "
         f"{sum(r['valid'] for r in results.values())})", all(r["forecasts"] == r["valid"] for r in results.values())),
        (f"output {max(r['completion'] for r in results.values())} <= max_tokens {r3['max_tokens']}",
         all(r["completion"] <= r["max_tokens"] for r in results.values())),
    ]
    for text, ok in checks:
        print(f"{'OK  ' if ok else 'MISS'} {text}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
