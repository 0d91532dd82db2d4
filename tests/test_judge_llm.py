"""The llm policy with patches (search.patches: true): the prompt carries the editable source within the
round's text, and a reply's SEARCH/REPLACE blocks become the unified diff the gate judges."""

from __future__ import annotations

import json
from pathlib import Path

from kernel_assets.agent.base import AgentContext
from kernel_assets.agent.llm import parse_suggestions
from kernel_assets.agent.prompt import build_suggest_messages
from kregress.core.family import get_family
from kregress.core.patch import apply_and_check, editable_set, parse_patch, read_sources
from kregress.core.records import variant_hash
from kregress.core.spec import load_spec

REPO = Path(__file__).resolve().parents[1]


def ctx(patches: bool) -> AgentContext:
    spec = load_spec(REPO / "specs" / "gemm_smoke.yaml")
    spec = spec.model_copy(update={"search": spec.search.model_copy(update={"patches": patches}),
                                   "patches": spec.patches.model_copy(update={"max_source_chars": 6000})})
    return AgentContext(spec=spec, family=get_family("gemm"), round=1, n=2, history=[], objective={},
                        profile_summary="", failures=[])


def test_prompt_shows_the_editable_source_only_when_patches_are_on():
    off = build_suggest_messages(ctx(False), rows=5)
    on = build_suggest_messages(ctx(True), rows=5)
    assert "EDITABLE SOURCE" not in off[1]["content"] and "<<<<<<< SEARCH" not in off[0]["content"]
    assert "<<<<<<< SEARCH" in on[0]["content"] and "EDITABLE SOURCE" in on[1]["content"]
    assert "def gemm_kernel(" in on[1]["content"] and "def reference(" not in on[1]["content"]
    # bounded: the source part is cut at patches.max_source_chars
    assert len(on[1]["content"]) - len(off[1]["content"]) <= 6000 + 100


def reply(patch: str) -> str:
    return json.dumps([{"variant_id": "r1_v1", "config": ctx(True).spec.baseline, "patch_summary": "acc += dot",
                        "expected_effect": "fewer instructions", "risk": "low", "patch": patch}])


BLOCKS = "kernels/gemm.py\n<<<<<<< SEARCH\n        acc = tl.dot(a, b, acc)\n=======\n        acc += tl.dot(a, b)\n>>>>>>> REPLACE\n"


def test_search_replace_reply_becomes_a_unified_diff():
    c = ctx(True)
    parsed = parse_suggestions(reply(BLOCKS), c)
    got, dropped = parsed.suggestions, parsed.dropped
    assert not dropped and len(got) == 1
    p = parse_patch(got[0].patch)
    es = editable_set(c.family)
    assert "acc += tl.dot(a, b)" in apply_and_check(p, read_sources(es)).new_texts["kernels/gemm.py"]
    assert got[0].config_hash != variant_hash(c.spec.baseline) and got[0].patch_sha256


def test_patches_are_dropped_with_a_reason():
    parsed = parse_suggestions(reply(BLOCKS), ctx(False))
    got, dropped = parsed.suggestions, parsed.dropped
    assert not got and "search.patches: false" in dropped[0].reason
    parsed = parse_suggestions(reply(BLOCKS.replace("acc = tl.dot(a, b, acc)", "no such line")), ctx(True))
    got, dropped = parsed.suggestions, parsed.dropped
    assert not got and "occurs 0 times" in dropped[0].reason
    parsed = parse_suggestions(reply("just words"), ctx(True))
    got, dropped = parsed.suggestions, parsed.dropped
    assert not got and "no unified diff" in dropped[0].reason
