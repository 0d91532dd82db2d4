"""The llm policy, the hybrid policy, the prompt and the report narrative (against the fake server)."""

from __future__ import annotations

import json
import logging

import pytest
from gateway_helpers import make_gateway

from kernel_assets.agent.base import AgentContext, Proposal, validate_and_dedupe
from kernel_assets.agent.llm import HybridPolicy, LLMPolicy, extract_json, parse_suggestions, write_narrative
from kernel_assets.agent.prompt import SUGGEST_SYSTEM_PROMPT, build_suggest_messages
from kernel_assets.profile import HEADER, failure_lines, summarize_history
from kregress.core.family import Family, Rule, Space
from kregress.core.records import CompileStats, Measurement, Suggestion, VariantResult, config_hash
from kregress.core.spec import Budget, TaskSpec
from kregress.testing.fake_gateway import Reply
from resources.taotoken import CredentialsError, RetriesExhausted

KEY = "sk" "-agent-test-key-00000000000000"
ENV = {"TAOTOKEN_KEY_SUGGEST": KEY, "TAOTOKEN_KEY_REPORT": KEY + "-report"}

SPACE = Space(
    params={"BLOCK_M": (32, 64, 128), "BLOCK_N": (32, 64, 128), "num_warps": (4, 8)},
    rules=(Rule("tile", "BLOCK_M * BLOCK_N <= 8192", lambda c, p, lim: c["BLOCK_M"] * c["BLOCK_N"] <= 8192),),
)
FAMILY = Family(name="toy", space=SPACE, shape_keys=("M", "N"), headline_metric="tflops")


def make_spec(**kw) -> TaskSpec:
    fields = dict(
        task_id="toy-sweep",
        kernel_family="toy",
        shape_matrix=[{"M": 4096, "N": 4096}, {"M": 8192, "N": 1024}],
        correctness_shapes=[{"M": 64, "N": 64}],
        baseline={"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4},
    )
    fields.update(kw)
    return TaskSpec.model_construct(**fields)


def row(vid: str, rnd: int, cfg: dict, p50: float | None, error: str | None = None, detail: str = "") -> VariantResult:
    meas = []
    if p50 is not None:
        meas = [
            Measurement(shape=s, samples_ms=[p50] * 10, p20_ms=p50 * 0.98, p50_ms=p50 * f, p80_ms=p50 * 1.02, tflops=600.0 / p50,
                        gbps=1000.0, evidence="model", device="H100", torch_version="2", triton_version="3")
            for s, f in (("4096x4096", 1.0), ("8192x1024", 0.5))
        ]
    cs = CompileStats(arch="sm_90", regs_per_thread=128 + cfg["BLOCK_M"] // 2, spill_bytes=0, smem_bytes=cfg["BLOCK_M"] * 1024,
                      num_warps=cfg["num_warps"], num_stages=3, occupancy=0.25, blocks_per_sm=2, occupancy_limiter="regs",
                      sass_instructions=1000, sass_mix={"HGMMA": 64}, compile_seconds=1.0)
    return VariantResult(variant_id=vid, round=rnd, source="local", config=cfg, config_hash=config_hash(cfg), error=error,
                         error_detail=detail, compile=cs, measurements=meas, evidence="model" if meas else None)


HISTORY = [
    row("baseline", 0, {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4}, 1.0),
    row("r1_v1", 1, {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8}, 0.8),
    row("r1_v2", 1, {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4}, 1.5),
    row("r1_v3", 1, {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 4}, None, "compile_failed", "ptxas error: too many resources requested for launch"),
]


def make_ctx(spec: TaskSpec | None = None, n: int = 3, rnd: int = 2, history=None) -> AgentContext:
    spec = spec or make_spec()
    history = HISTORY if history is None else history
    return AgentContext(
        spec=spec, family=FAMILY, round=rnd, n=n, history=list(history), objective={}, profile_summary=summarize_history(history, 5),
        failures=failure_lines(history), run_id="run-x", partition="toy-sweep",
    )


def item(vid, bm=32, bn=64, w=8, **extra):
    d = {"variant_id": vid, "config": {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w}, "patch_summary": "smaller M tile",
         "expected_effect": "better wave fill", "risk": "low"}
    d.update(extra)
    return d


def compact(vid, bm=32, bn=64, w=8, x=(1.1, 0.95, 1.3), **extra):
    """A proposal in the compact reply schema: c in the space's key order (BLOCK_M, BLOCK_N, num_warps)."""
    d = {"id": vid, "c": [bm, bn, w], "x": list(x) if isinstance(x, (list, tuple)) else x, "b": "compute", "s": "smaller M tile"}
    d.update(extra)
    return d


# --- prompt ---------------------------------------------------------------------------------------


def test_summarize_history_is_one_line_per_row_best_first():
    text = summarize_history(HISTORY, 2)
    lines = text.splitlines()
    assert lines[0] == HEADER == "variant|c|speedup|fc|TFLOP/s|regs|smem_kb|occ|error"
    assert lines[1].startswith("r1_v1|128/64/8|1.25|-|750|")  # baseline p50 0.707 / 0.566 (geomean of 0.8 and 0.4)
    assert lines[2].startswith("baseline|64/64/4|1.00|-|600|")
    assert lines[-1] == "(+2 more rows not shown, 1 of them failed)"
    assert len(lines) == 4
    full = summarize_history(HISTORY, 10).splitlines()
    assert full[-1] == "r1_v3|128/32/4|-|-|-|192|128|0.25|compile_failed"


def test_the_prompt_shows_the_family_headline_metric_in_its_own_unit():
    memory_bound = Family(name="toy_decode", space=SPACE, shape_keys=("M", "N"), headline_metric="gbps")
    ctx = make_ctx()
    ctx.family = memory_bound
    user = build_suggest_messages(ctx, rows=5)[1]["content"]
    assert "|GB/s|" in user and "TFLOP/s" not in user and "r1_v1|128/64/8|1.25|-|1000|" in user  # gbps, not tflops
    assert "1000 GB/s" in user  # the baseline line too
    assert "|TFLOP/s|" in build_suggest_messages(make_ctx(), rows=5)[1]["content"]


def test_user_prompt_has_the_structured_task_and_respects_rows():
    ctx = make_ctx()
    msgs = build_suggest_messages(ctx, rows=5)
    assert msgs[0] == {"role": "system", "content": SUGGEST_SYSTEM_PROMPT}
    user = msgs[1]["content"]
    for needle in ("TASK: 3 new variants for round 2 of toy", "ids r2_v1..r2_v3",
                   "OBJECTIVE: minimize latency_p50 (geomean over shapes 4096x4096, 8192x1024)",
                   "CONSTRAINTS: regs/thread <= 255", SPACE.describe(), "BASELINE: c 64/64/4; p50 0.707 ms",
                   "MEASURED (top 5", "FAILURES:\nr1_v3 [128/32/4]: compile_failed: ptxas error",
                   "DO NOT REPEAT (c): 128/32/4 128/64/8 32/32/4 64/64/4"):
        assert needle in user, needle
    one = build_suggest_messages(ctx, rows=1)[1]["content"]
    assert one.count("|128/") < user.count("|128/") and "(+" in one
    zero = build_suggest_messages(ctx, rows=0)[1]["content"]
    assert "MEASURED (top" not in zero and "FAILURES" not in zero and "SPACE:" in zero
    fed = make_ctx()
    fed.feedback = ["outside the space: BLOCK_M=96 not in {32, 64, 128}: {...}"]
    assert "YOUR LAST ANSWER:\noutside the space: BLOCK_M=96" in build_suggest_messages(fed, rows=5)[1]["content"]


# --- parsing --------------------------------------------------------------------------------------


def test_extract_json_is_tolerant_about_wrapping():
    assert extract_json('```json\n[{"a": 1}]\n```') == ([{"a": 1}], None)
    assert extract_json('Here you go:\n[{"a": 1}]\nHope it helps.') == ([{"a": 1}], None)
    assert extract_json("I think BLOCK_M should be larger.")[1] == "response is prose, not JSON"
    assert "not valid JSON" in extract_json('[{"a": 1,}')[1]


def test_the_compact_schema_carries_config_values_and_the_forecast():
    ctx = make_ctx()
    resp = json.dumps([compact("r2_v1", 32, 64, 8, x=[1.2, 1.05, 1.4]),
                       compact("r2_v2", 64, 32, 8, x=[1.1, 1.2, 1.3]),  # interval does not hold the estimate
                       compact("r2_v3", 32, 128, 4, x=1.3, b="bandwidth"),  # no interval, unknown bottleneck
                       {"id": "r2_v4", "c": [32, 64], "x": [1, 1, 1]},  # two values for three tunables
                       compact("r2_v5", s="y" * 130)])  # summary over 120 characters: cut, the config kept
    p = parse_suggestions(resp, ctx)
    assert [s.variant_id for s in p.suggestions] == ["r2_v1", "r2_v2", "r2_v3", "r2_v5"] and p.unusable is None
    s1, s2, s3, s5 = p.suggestions
    assert s5.patch_summary == "y" * 117 + "..."
    assert s1.config == {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 8} and s1.patch_summary == "smaller M tile"
    assert (s1.expected_speedup, s1.expected_speedup_low, s1.expected_speedup_high, s1.bottleneck) == (1.2, 1.05, 1.4, "compute")
    assert s2.expected_speedup is None and s3.expected_speedup is None and s3.bottleneck is None
    assert any("r2_v2: forecast [1.1, 1.2, 1.3]: the interval must hold the estimate" in n for n in p.notes)
    assert any("r2_v3: forecast 1.3 has no 80% interval" in n for n in p.notes)
    assert any("r2_v3: bottleneck" in n for n in p.notes)
    reasons = [d.reason for d in p.dropped]
    assert reasons == ["c has 2 values, the space has 3 tunables (BLOCK_M, BLOCK_N, num_warps)"]


def test_parse_keeps_valid_proposals_and_records_every_drop():
    ctx = make_ctx()
    resp = json.dumps([
        item("r2_v1"),
        {"config": {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 8}},  # no variant_id
        item("r2_v3", patch_summary="x" * 200),  # schema: too long
        "not an object",
        item("r2_v5", rationale="ignored"),
        {"variant_id": "r2_v6", "config": "BLOCK_M=64"},
    ])
    p = parse_suggestions(resp, ctx)
    # a summary that is too long describes the variant: it is cut, never a reason to drop the config
    assert [s.variant_id for s in p.suggestions] == ["r2_v1", "r2_v3", "r2_v5"]
    assert p.suggestions[1].patch_summary == "x" * 117 + "..." and any("r2_v3: patch_summary cut to 120" in n for n in p.notes)
    assert all(s.source == "llm" and s.round == 2 for s in p.suggestions)
    reasons = [d.reason for d in p.dropped]
    assert reasons[0] == "no variant id" and reasons[1] == "proposal is a str, not an object"
    assert reasons[2] == "no config object"
    assert all(d.round == 2 and d.source == "llm" and len(d.raw) <= 400 for d in p.dropped)
    assert any("ignored unknown keys rationale" in n for n in p.notes)
    assert any("r2_v1: no forecast (expected_speedup)" in n for n in p.notes)  # the long form without a forecast


def test_free_text_in_descriptive_fields_keeps_every_valid_config():
    """Issue 32: a long-form reply whose risk, expected_effect and patch_summary are free text (models write
    "more shared memory" for a risk) keeps all of its valid configs; only what defines a variant refuses it."""
    ctx = make_ctx(n=9)
    configs = [(32, 32, 8), (32, 64, 4), (32, 64, 8), (32, 128, 4), (32, 128, 8), (64, 32, 4), (64, 32, 8), (64, 64, 8)]
    resp = json.dumps([
        {"variant_id": f"r2 v{i}" if i == 0 else f"r2_v{i}", "config": {"BLOCK_M": m, "BLOCK_N": n, "num_warps": w},
         "patch_summary": "Use a narrower tile so that more blocks fit per SM and the tail wave is shorter, " * 3,
         "expected_effect": {"latency": "down", "why": "better wave quantization"} if i == 1 else "faster " * 60,
         "risk": ["more shared memory", "Medium", "HIGH", "low-ish", 3, None, "spills possible", "medium"][i],
         "parent": 7 if i == 2 else "baseline", "expected_speedup": 1.1, "expected_speedup_low": 0.9, "expected_speedup_high": 1.3}
        for i, (m, n, w) in enumerate(configs)
    ] + [{"variant_id": "r2_bad", "config": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4}, "risk": "free text too"}])
    p = parse_suggestions(resp, ctx)
    assert len(p.suggestions) == 9 and not p.dropped, [d.reason for d in p.dropped]
    kept, dropped = validate_and_dedupe(ctx, p.suggestions, "llm")
    assert {(s.config["BLOCK_M"], s.config["BLOCK_N"], s.config["num_warps"]) for s in kept} == set(configs)
    # every valid config is measured; the one outside the space (128x128) is refused by its config, the defining field
    assert [x for x in dropped if "r2_bad" in x.raw] and "BLOCK_M * BLOCK_N" in " ".join(x.reason for x in dropped)
    by_id = {s.variant_id: s for s in p.suggestions}
    assert by_id["r2_v0"].risk == "medium" and "risk: more shared memory" in by_id["r2_v0"].expected_effect  # default, text kept
    assert by_id["r2_v1"].risk == "medium" and '"latency":"down"' in by_id["r2_v1"].expected_effect
    assert by_id["r2_v2"].risk == "high" and by_id["r2_v2"].parent is None
    assert all(len(s.patch_summary) <= 120 and len(s.expected_effect) <= 300 for s in p.suggestions)
    assert any("r2 v0: variant id 'r2 v0' renamed 'r2_v0'" in n for n in p.notes)
    assert any("risk 'more shared memory' is not low/medium/high" in n for n in p.notes)


@pytest.mark.parametrize(
    "text,finish,cause,reason",
    [
        ("Sure! I would increase BLOCK_M to 128 and use 8 warps.", "stop", "prose", "response is prose, not JSON"),
        ('[{"variant_id": "r2_v1", "config": {"BLOCK_M": 32,', "stop", "not_json", "response is not valid JSON"),
        ('[{"id": "r2_v1", "c": [32, 64', "length", "cut_short", "response is not valid JSON"),
        ('{"variant_id": "r2_v1", "config": {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 8}}', "stop", "not_array",
         "expected a JSON array of proposals, got an object"),
        ("[" + ",".join([json.dumps(item("r2_v1"))] * 2000) + "]", "stop", "too_large", "response too large"),
        ("   ", "stop", "empty", "empty response"),
    ],
)
def test_unusable_content_is_classified_with_its_fix(text, finish, cause, reason):
    p = parse_suggestions(text, make_ctx(), finish_reason=finish)
    assert p.suggestions == [] and len(p.dropped) == 1 and p.dropped[0].reason.startswith(reason)
    assert p.unusable.cause == cause and p.unusable.fix
    line = p.unusable.line(2)
    assert line.startswith("round 2: no usable proposal from llm: ") and " Fix: " in line and "\n" not in line


def test_an_empty_array_says_the_model_found_the_constraints_unmeetable():
    p = parse_suggestions("[]", make_ctx())
    assert p.suggestions == [] and p.unusable.cause == "empty_array" and "cannot be met" in p.unusable.what


def test_too_many_items_are_cut():
    text = json.dumps([item(f"v{i}") for i in range(70)])
    p = parse_suggestions(text, make_ctx())
    assert len(p.suggestions) == 64 and len(p.dropped) == 6 and "only the first 64 read" in p.notes[0]


# --- duplicate ids and configs ---------------------------------------------------------------------


def test_reused_ids_keep_every_valid_config_renamed_deterministically():
    """5 of 6 valid configs were lost when the model reused one id; now all 6 are kept, renamed by position."""
    ctx = make_ctx(n=8)
    cfgs = [(32, 64, 8), (64, 32, 8), (32, 128, 4), (64, 128, 4), (128, 32, 8), (32, 32, 8)]
    resp = json.dumps([compact("r2_v1", *c) for c in cfgs])
    first = LLMPolicy.__new__(LLMPolicy)  # parsing and dedupe only: no gateway needed
    from kernel_assets.agent.base import dedupe

    p = parse_suggestions(resp, ctx)
    d = dedupe(ctx, p.suggestions, "llm")
    assert [s.variant_id for s in d.kept] == ["r2_v1", "r2_v2", "r2_v3", "r2_v4", "r2_v5", "r2_v6"]
    assert [tuple(s.config.values()) for s in d.kept] == cfgs and d.dropped == []
    assert d.notes[0] == "llm: variant_id r2_v1 was already used earlier in this answer: renamed r2_v2"
    again = dedupe(ctx, parse_suggestions(resp, ctx).suggestions, "llm")
    assert [s.variant_id for s in again.kept] == [s.variant_id for s in d.kept]  # deterministic
    del first


def test_ids_from_an_earlier_round_are_renamed_and_identical_configs_measured_once():
    """A whole round reusing round-1 ids used to 'propose nothing new'; identical configs are measured once."""
    ctx = make_ctx(n=8)
    resp = json.dumps([compact("r1_v1", 32, 64, 8), compact("r1_v2", 64, 32, 8), compact("r1_v3", 32, 64, 8),
                       compact("baseline", 64, 128, 4), compact("r2_v9", 64, 64, 4)])
    from kernel_assets.agent.base import dedupe

    d = dedupe(ctx, parse_suggestions(resp, ctx).suggestions, "llm")
    assert [(s.variant_id, tuple(s.config.values())) for s in d.kept] == [
        ("r2_v1", (32, 64, 8)), ("r2_v2", (64, 32, 8)), ("r2_v4", (64, 128, 4))]
    assert [x.reason for x in d.dropped] == ["the same config as r2_v1 in this answer: measured once",
                                             "config already measured in this sweep (as baseline)"]
    assert "llm: variant_id r1_v1 was already used in an earlier round: renamed r2_v1" in d.notes
    assert "llm: variant_id baseline was already used in an earlier round: renamed r2_v4" in d.notes


# --- the policy through the gateway ----------------------------------------------------------------


def test_llm_policy_end_to_end(srv, ledger):
    g = make_gateway(srv, ledger, ENV)
    ctx = make_ctx(n=3)
    content = "```json\n" + json.dumps([
        compact("r2_v1", 32, 64, 8, x=[1.3, 1.1, 1.5]),
        compact("r2_v2", 128, 128, 8),  # outside the space (rule)
        compact("r2_v3", 64, 64, 4),  # already measured (the baseline)
        compact("r2_v4", 64, 128, 4, x=[0.9, 0.8, 1.05]),
        compact("r2_v5"),  # same config as r2_v1
    ]) + "\n```"
    srv.push(content=content, prompt_tokens=900, completion_tokens=120)
    prop = LLMPolicy(g).propose(ctx)
    assert [s.variant_id for s in prop.suggestions] == ["r2_v1", "r2_v4"] and prop.unusable is None
    assert [s.expected_speedup for s in prop.suggestions] == [1.3, 0.9]  # the forecasts, before anything is measured
    assert {d.reason.split(":")[0].split(" (")[0] for d in prop.dropped} == {
        "outside the space", "config already measured in this sweep", "the same config as r2_v1 in this answer"}
    assert prop.tokens == {"prompt": 900, "completion": 120, "total": 1020} and prop.model == "kregress-test-model"
    body = srv.chat_requests()[0].body
    assert body["messages"][0]["content"] == SUGGEST_SYSTEM_PROMPT and body["max_tokens"] == 1536
    rows = ledger.usage.rows()
    assert len(rows) == 1 and (rows[0].round, rows[0].task, rows[0].partition, rows[0].run_id) == (2, "round_2_suggestions", "toy-sweep", "run-x")


@pytest.mark.parametrize(
    "content,cause",
    [
        ("I recommend trying a bigger tile.", "prose"),
        ('[{"variant_id": "r2_v1", "config": ', "not_json"),
        ('{"variants": []}', "not_array"),
        ("[" + ",".join([json.dumps(item("r2_v1"))] * 1000) + "]", "too_large"),
        (json.dumps([compact(f"r2_v{i}", 96, 64, 8) for i in range(6)]), "outside_space"),  # six configs, none in the space
        (json.dumps([compact("r2_v1", 64, 64, 4), compact("r2_v2", 32, 32, 4)]), "duplicate"),  # both already measured
        (json.dumps([{"id": "r2_v1"}, {"id": "r2_v2", "c": "BM64"}]), "schema"),
        ("[]", "empty_array"),
    ],
)
def test_llm_policy_unusable_content_is_a_value_with_a_true_cause(srv, ledger, content, cause):
    g = make_gateway(srv, ledger, ENV)
    srv.push(content=content)
    prop = LLMPolicy(g).propose(make_ctx())
    assert prop.suggestions == [] and prop.unusable.cause == cause
    reason = prop.stop_reason(2, "llm")
    assert reason.startswith("round 2: no usable proposal from llm: ") and "proposed nothing new" not in reason
    if cause == "outside_space":
        assert "6 of 6 proposal(s); first: outside the space: BLOCK_M=96" in reason  # the model did propose six
    assert len(ledger.usage.rows()) == 1 and len(srv.chat_requests()) == 1


def test_an_empty_choices_list_is_a_content_error_with_its_own_fix_and_its_usage_recorded(srv, ledger):
    g = make_gateway(srv, ledger, ENV)
    srv.push(body={"id": "chatcmpl-x", "object": "chat.completion", "created": 1, "model": "kregress-test-model", "choices": [],
                   "usage": {"prompt_tokens": 812, "completion_tokens": 0, "total_tokens": 812}})
    prop = LLMPolicy(g).propose(make_ctx())
    assert prop.suggestions == [] and prop.unusable.cause == "no_choices"
    assert "empty choices list" in prop.unusable.what and "TAOTOKEN_BASE_URL" not in prop.unusable.line(2)
    assert "TAOTOKEN_MODEL_ID" in prop.unusable.fix
    (row,) = ledger.usage.rows()
    assert (row.status, row.error_class, row.prompt_tokens, row.total_tokens) == ("error", "content:200", 812, 812)
    assert ledger.usage.spend("run-x").total == 812  # charged as billed, not released
    assert len(srv.chat_requests()) == 1  # a content failure is not retried


def test_llm_policy_shrinks_history_then_refuses_when_over_budget(srv, ledger):
    g = make_gateway(srv, ledger, ENV)
    ctx = make_ctx()
    from resources.taotoken import estimate_messages_tokens

    fit1 = estimate_messages_tokens(build_suggest_messages(ctx, 1))
    spec = make_spec(budget=Budget(max_input_tokens_per_round=fit1 + 1, max_output_tokens_per_round=4000, max_total_tokens=50_000))
    srv.push(content=json.dumps([compact("r2_v1")]))
    prop = LLMPolicy(g).propose(make_ctx(spec=spec))
    assert len(prop.suggestions) == 1 and any("prompt shrunk to 1 of 5 history rows" in n for n in prop.notes)
    tiny = make_spec(budget=Budget(max_input_tokens_per_round=50, max_output_tokens_per_round=4000, max_total_tokens=50_000))
    prop = LLMPolicy(g).propose(make_ctx(spec=tiny, rnd=3))
    assert prop.suggestions == [] and prop.notes[0].startswith("BudgetExceeded: round 3 input")
    (b,) = prop.refused
    assert (b.kind, b.limit, b.round, b.allowed) == ("round", "max_input_tokens_per_round", 3, 50) and b.by > 0
    assert prop.stop_reason(3, "llm").startswith("round 3: the token budget refused the suggest prompt, nothing was sent")
    assert len(srv.chat_requests()) == 1


def test_llm_policy_without_a_key_raises_a_credentials_error(srv, ledger):
    g = make_gateway(srv, ledger, {"OPENAI_API_KEY": "sk-other"})
    with pytest.raises(CredentialsError, match="no TAOTOKEN key for role suggest"):
        LLMPolicy(g).propose(make_ctx())


def test_llm_policy_outage_through_the_round_fails_with_one_line(srv, ledger):
    g = make_gateway(srv, ledger, ENV, retry_horizon_s=5.0)
    srv.default = Reply(status=503, headers={"Retry-After": "2"})  # down for good
    with pytest.raises(RetriesExhausted) as ei:
        LLMPolicy(g).propose(make_ctx())
    text = str(ei.value)
    assert text.startswith("[transient] llm round 2: no proposals, the gateway stayed down") and " Fix: " in text
    assert "\n" not in text and ei.value.one_line() == text
    assert len(srv.chat_requests()) == 3  # waits of 2 s + 2 s fit a 5 s horizon, a third would not


def test_hybrid_continues_with_local_proposals_through_an_outage(srv, ledger):
    g = make_gateway(srv, ledger, ENV, retry_horizon_s=5.0)
    srv.default = Reply(status=429, headers={"Retry-After": "2"})
    local = EnumPolicy()
    prop = HybridPolicy(LLMPolicy(g), local).propose(make_ctx(n=2))
    assert [s.source for s in prop.suggestions] == ["local", "local"] and local.calls == 1
    assert prop.notes[0].startswith("llm unavailable (transient): [transient] llm round 2")
    assert "round 2 continues with local proposals only" in prop.notes


@pytest.mark.parametrize("content", ["Try BLOCK_M 128, it should help.", json.dumps([compact("r2_v1", 96, 64, 8)])])
def test_hybrid_goes_on_with_local_when_the_answer_is_unusable_and_says_so_once(srv, ledger, content):
    g = make_gateway(srv, ledger, ENV)
    srv.push(content=content)
    said = []
    ctx = make_ctx(n=2)
    ctx.log = type("Log", (), {"warning": lambda self, m: said.append(m), "info": lambda self, m: None})()
    prop = HybridPolicy(LLMPolicy(g), EnumPolicy()).propose(ctx)
    assert [s.source for s in prop.suggestions] == ["local", "local"] and prop.unusable is None
    (line,) = said
    assert line.startswith("round 2: no usable proposal from llm: ") and "continuing with local proposals" in line and " Fix: " in line


class EnumPolicy:
    """A deterministic stand-in for the local policy: the space in order, skipping what was measured."""

    name = "local"

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, ctx: AgentContext) -> Proposal:
        self.calls += 1
        cands = [
            Suggestion(variant_id=f"r{ctx.round}_v{i + 1}", config=c, patch_summary="enumerated", round=ctx.round, source="local")
            for i, c in enumerate(ctx.family.space.enumerate(ctx.spec.params))
        ]
        kept, dropped = validate_and_dedupe(ctx, cands, "local")
        return Proposal(kept, dropped)


def test_hybrid_tops_up_with_local(srv, ledger):
    g = make_gateway(srv, ledger, ENV)
    srv.push(content=json.dumps([compact("r2_v1", 32, 32, 8), compact("bad", 128, 128, 8)]))
    ctx = make_ctx(n=4)
    prop = HybridPolicy(LLMPolicy(g), EnumPolicy()).propose(ctx)
    assert len(prop.suggestions) == 4
    assert prop.suggestions[0].source == "llm" and [s.source for s in prop.suggestions[1:]] == ["local"] * 3
    hashes = [s.config_hash for s in prop.suggestions]
    ids = [s.variant_id for s in prop.suggestions]
    assert len(set(hashes)) == 4 and len(set(ids)) == 4
    assert not ({s.config_hash for s in prop.suggestions} & ctx.measured_hashes)
    assert any("topped up with 3 local" in n for n in prop.notes)
    assert any(d.reason.startswith("outside the space") for d in prop.dropped)


def test_hybrid_without_a_key_is_all_local(srv, ledger):
    g = make_gateway(srv, ledger, {})
    local = EnumPolicy()
    prop = HybridPolicy(LLMPolicy(g), local).propose(make_ctx(n=2))
    assert [s.source for s in prop.suggestions] == ["local", "local"] and local.calls == 1
    assert prop.notes[0].startswith("llm unavailable (credentials)")
    assert srv.requests == []


def test_hybrid_with_enough_llm_proposals_does_not_call_local(srv, ledger):
    g = make_gateway(srv, ledger, ENV)
    srv.push(content=json.dumps([compact("r2_v1", 32, 32, 8), compact("r2_v2", 32, 64, 4)]))
    local = EnumPolicy()
    prop = HybridPolicy(LLMPolicy(g), local).propose(make_ctx(n=2))
    assert [s.source for s in prop.suggestions] == ["llm", "llm"] and local.calls == 0


# --- narrative -----------------------------------------------------------------------------------

VERDICTS = """| variant | verdict | ratio | reasons |
|---|---|---|---|
| r1_v1 | PASS | 0.91 | faster on cuda |
| r1_v2 | REGRESS | 1.40 | slower |
| r1_v3 | NEEDS_REVIEW | - | model evidence only |
| r2_v1 | PASS | 0.95 | faster |
"""


def test_narrative_without_a_key_is_a_plain_summary_and_says_so(srv, ledger):
    g = make_gateway(srv, ledger, {"TAOTOKEN_KEY_SUGGEST": KEY})
    text, source = write_narrative(g, make_spec(), VERDICTS)
    assert source == "fallback: no TAOTOKEN key for role report"
    assert "4 variant(s) judged: 2 PASS, 1 REGRESS, 1 NEEDS_REVIEW" in text and "without a model" in text
    assert write_narrative(None, make_spec(), VERDICTS)[1] == source
    assert srv.requests == []


def test_narrative_with_a_key_calls_the_report_role_once(srv, ledger):
    g = make_gateway(srv, ledger, ENV)
    srv.push(content="Two variants passed; r1_v2 regressed by 40%.")
    text, source = write_narrative(g, make_spec(), VERDICTS, run_id="run-x")
    assert text == "Two variants passed; r1_v2 regressed by 40%."
    assert source.startswith("llm:report#") and source.endswith(":kregress-test-model")
    chats = srv.chat_requests()
    assert len(chats) == 1 and chats[0].token == KEY + "-report" and "r1_v2 | REGRESS" in chats[0].body["messages"][1]["content"]
    r = ledger.usage.rows()[0]
    assert (r.role, r.run_id, r.partition, r.round, r.task) == ("report", "run-x", "toy-sweep", 0, "verdict_report")
    assert ledger.usage.spend("run-x").calls == 1  # counted in the sweep's budget scope


def test_narrative_falls_back_on_gateway_errors(srv, ledger):
    g = make_gateway(srv, ledger, ENV)
    srv.push(status=401, body={"error": {"message": "bad key"}})
    text, source = write_narrative(g, make_spec(), VERDICTS)
    assert source.startswith("fallback: credentials error: [credentials]") and "2 PASS" in text
    tiny = make_spec(budget=Budget(max_total_tokens=10))
    text, source = write_narrative(g, tiny, VERDICTS)
    assert source.startswith("fallback: BudgetExceeded: sweep total")


def test_agent_logs_use_aliases(srv, ledger, caplog):
    caplog.set_level(logging.DEBUG)
    g = make_gateway(srv, ledger, ENV)
    srv.push(status=429, headers={"Retry-After": "1"})
    srv.push(content="[]")
    LLMPolicy(g).propose(make_ctx())
    assert "suggest#" in caplog.text and KEY not in caplog.text
