"""Issue 36's cheats (tests/redteam/upstream36/) through the gate, as `kregress judge` runs it on a CPU host:
a kernel that ignores `causal` and one that reads the 656-byte FP8 token's bf16 rope as fp8 must both be
REGRESS with cause `wrong` on a spec that calls mla_decode as FlashMLA's MTP decode does (causal: true,
s_q = 2, kv_dtype: fp8_flashmla). One judgement for both patches (one sandbox zygote, one set of secret
cases)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_assets.judge import judge, read_patch_args

REPO = Path(__file__).resolve().parents[1]
DIR = REPO / "tests" / "redteam" / "upstream36"
CHEATS = ("mla_decode_cheat_ignores_causal", "mla_decode_cheat_rope_as_fp8")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(home))
        before = {p: p.read_bytes() for p in (REPO / "kernels").glob("*.py")}
        res = judge(DIR / "mla_upstream_small.yaml", read_patch_args([str(DIR / f"{n}.patch") for n in CHEATS]),
                    log=lambda m: None)
        assert before == {p: p.read_bytes() for p in (REPO / "kernels").glob("*.py")}, "judging modified the tree"
    return {r.variant_id: (r, res.verdicts[r.variant_id]) for r in res.rows}


@pytest.mark.parametrize("name", CHEATS)
def test_cheat_is_regress_wrong(judged, name):
    row, verdict = judged[name]
    assert (verdict.verdict, verdict.cause) == ("REGRESS", "wrong"), (verdict.reasons, row.error_detail)
    # the patch applied and compiled: it was caught by the numbers, not refused before running
    assert row.gate is not None and row.gate.round_trip_ok
