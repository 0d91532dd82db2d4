"""The gate's input roles and hidden structure (issue 30, items 1-3), unit by unit: output buffers are
poisoned and compared as outputs (untouched regions bit for bit), read-only inputs must come back
bit-identical, every call gets its own copy, the families' structure cases keep what indexing depends on,
and the program sample covers every residue class. Pure functions on small CPU tensors (no process)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from kernels.candidate import _fresh, buffer_problems, input_problems, poison_buffers, sample_programs, shape_groups
from kernels.compile import compile_error_text
from kregress.core.family import get_family


def _grouped_masked_case(seed: int = 0, poison: str = "nan"):
    fam = get_family("grouped_gemm_fp8")
    params = {"layout": "masked", "group_sizes": [0, 5, 9]}
    shape = {"groups": 3, "m": 9, "N": 16, "K": 128}
    inputs = fam.make_inputs(shape, torch.float8_e4m3fn, "cpu", seed, params)
    poison_buffers(inputs, fam.output_buffers(params), poison, seed)
    return fam, params, inputs


def test_fresh_copies_never_alias_on_the_cpu():
    x = {"a": torch.ones(3), "n": 2, "l": [torch.zeros(2)]}
    y = _fresh(x, "cpu")
    y["a"].add_(1)
    y["l"][0].add_(1)
    assert x["a"].tolist() == [1.0, 1.0, 1.0] and x["l"][0].tolist() == [0.0, 0.0]
    assert x["a"].to("cpu") is x["a"]  # why _fresh exists: .to on the same device returns the same tensor


@pytest.mark.parametrize("mode", ["nan", "random"])
def test_poison_fills_only_the_declared_buffers(mode):
    fam, params, inputs = _grouped_masked_case(poison=mode)
    out = inputs["out"].float()
    assert (out.isnan().all() if mode == "nan" else (out.isfinite().all() and (out != 0).all()))
    assert fam.output_buffers(params) == {"out": 0} and "grp" in fam.structure_inputs(params)


def _correct_call(fam, params, inputs):
    """What a correct kernel does: writes the valid rows (the reference rounded to bf16), nothing else."""
    after = _fresh(inputs, "cpu")
    ref = fam.reference(_fresh(inputs, "cpu"), params)
    for g, n in enumerate(inputs["grp"].tolist()):
        after["out"][g, :n] = ref[g, :n].to(torch.bfloat16)
    return after, ref


@pytest.mark.parametrize("mode", ["nan", "random"])
def test_a_correct_kernel_passes_and_writing_padding_does_not(mode):
    fam, params, inputs = _grouped_masked_case(poison=mode)
    after, ref = _correct_call(fam, params, inputs)
    tol = [0.05, 0.02]
    assert buffer_problems(after["out"], after, inputs, ref, {"out": 0}, tol, mode) == []
    assert input_problems(after, inputs, {"out": 0}) == []
    bad = _fresh(after, "cpu")
    bad["out"][0] = 0.0  # group 0 has masked_m = 0: a correct kernel never writes it
    why = buffer_problems(bad["out"], bad, inputs, ref, {"out": 0}, tol, mode)
    assert any("leaves untouched" in w for w in why), why


def test_a_buffer_left_unwritten_or_a_result_elsewhere_is_caught():
    fam, params, inputs = _grouped_masked_case(poison="random")
    after, ref = _correct_call(fam, params, inputs)
    stale = _fresh(inputs, "cpu")  # wrote nothing: the buffer holds the poison
    assert any("does not hold the result" in w for w in buffer_problems(after["out"], stale, inputs, ref, {"out": 0}, [0.05, 0.02], "x"))


def test_read_only_inputs_must_come_back_bit_identical():
    fam, params, inputs = _grouped_masked_case()
    after = _fresh(inputs, "cpu")
    after["grp"][1] = 4  # the structure changed under the caller
    why = input_problems(after, inputs, {"out": 0})
    assert why and "grp" in why[0]
    after = _fresh(inputs, "cpu")
    after["sa"].view(torch.int32)[0, 0] ^= 1  # one bit of a scale
    assert input_problems(after, inputs, {"out": 0})


def test_reference_starts_from_the_buffer_as_handed_in():
    fam, params, inputs = _grouped_masked_case(poison="random")
    ref = fam.reference(_fresh(inputs, "cpu"), params)
    assert torch.equal(ref[0], inputs["out"][0].double())  # group 0: masked_m = 0, untouched
    assert not torch.equal(ref[1, :5], inputs["out"][1, :5].double())


@pytest.mark.parametrize("groups", [2, 4, 7])
def test_masked_draws_catch_a_kernel_reading_any_other_experts_count(groups):
    """The class behind grouped_masked_cheat_max_with_expert0 (missed in about 1 judgement of 16 when both draws
    gave expert 0 the empty slot): a kernel that takes its row count from another expert, fixed (j) or relative
    (g+1), alone or in max/min with its own, must write past or short of masked_m for some expert in one of the
    two draws, whichever expert it reads and whatever the secret draw."""
    fam = get_family("grouped_gemm_fp8")
    readings = {f"{op} {j}": (lambda s, g, j=j, f=f: f(s[g], s[j])) for j in range(max(4, groups))
                for op, f in (("max with", max), ("min with", min), ("count of", lambda own, other: other))}
    readings["count of g+1"] = lambda s, g: s[(g + 1) % len(s)]
    readings["count of g-1"] = lambda s, g: s[(g - 1) % len(s)]
    for seed in range(300):
        cases = fam.structure_cases([{"groups": groups, "m": 40, "N": 32, "K": 128}], {"layout": "masked"},
                                    random.Random(seed))
        draws = [c[2]["group_sizes"] for c in cases]
        for name, read in readings.items():
            assert any(read(s, g) != s[g] for s in draws for g in range(len(s))), (seed, name, draws)


def _other_slot_readings(n: int) -> dict:
    """Every way a kernel can take slot b's value from another slot of n: a fixed slot j (its value, or max or
    min of it with its own) or a neighbour (b+1, b-1; wrapped or clamped)."""
    out = {f"{op} {j}": (lambda s, b, j=j, f=f: f(s[b], s[j])) for j in range(n)
           for op, f in (("max with", max), ("min with", min), ("value of", lambda own, other: other))}
    out["value of b+1"] = lambda s, b: s[(b + 1) % len(s)]
    out["value of b-1"] = lambda s, b: s[(b - 1) % len(s)]
    out["value of b+1, clamped"] = lambda s, b: s[min(b + 1, len(s) - 1)]
    out["value of b-1, clamped"] = lambda s, b: s[max(b - 1, 0)]
    out["max with b+1"] = lambda s, b: max(s[b], s[(b + 1) % len(s)])
    out["min with b-1"] = lambda s, b: min(s[b], s[(b - 1) % len(s)])
    return out


def _assert_some_draw_tells(draws: list[list[int]], what: str, seed: int) -> None:
    n = len(draws[0])
    for name, read in _other_slot_readings(n).items():
        assert any(read(s, b) != s[b] for s in draws for b in range(n)), (seed, what, name, draws)


def test_reversed_rank_pair_tells_every_other_slot_reading_apart():
    """The placement itself, on distinct values and on values with a unique smallest and largest (the masked
    layout's counts: 0, full, and repeats between)."""
    from kregress.core.family import reversed_rank_pair

    for seed in range(500):
        rng = random.Random(seed)
        n = 2 + seed % 7
        draws = reversed_rank_pair(rng, lambda rng=rng, n=n: rng.sample(range(1, 100), n))
        assert len(set(draws[0])) == len(set(draws[1])) == n
        _assert_some_draw_tells(list(draws), "distinct", seed)
        draws = reversed_rank_pair(rng, lambda rng=rng, n=n: [0, 9] + [rng.randint(1, 8) for _ in range(n - 2)])
        _assert_some_draw_tells(list(draws), "unique extremes", seed)


@pytest.mark.parametrize("params", [{}, {"seqlens": "spread", "prefix": [0, 24]}, {"seqlens": [64, 64]},
                                    {"prefix": 32, "window": [31, 0]}])
def test_ragged_attention_draws_catch_a_kernel_reading_another_sequences_length(params):
    """Whatever the spec's seqlens (a uniform batch has nothing to tell apart), two ragged structure cases: a
    kernel that takes sequence b's query or key length from another sequence (fixed, neighbour, max/min with
    its own) or ignores cu_seqlens (a dense batch of max_seqlen rows) is wrong in one of them, every draw."""
    fam = get_family("attention")
    from kernels.attention import key_lengths, seq_lengths

    for seed in range(300):
        cases = fam.structure_cases([{"batch": 2, "seqlen": 64, "h_q": 8, "h_kv": 2, "head_dim": 64}], dict(params),
                                    random.Random(seed))
        ragged = [(shape, dict(params, **over)) for kind, shape, over in cases if kind.startswith("structure_ragged")]
        assert len(ragged) == 2, [c[0] for c in cases]
        for shape, p in ragged:
            assert fam.check_params(p) is None and shape["h_q"] // shape["h_kv"] == 4  # the spec's GQA ratio kept
        q = [seq_lengths(shape, p) for shape, p in ragged]
        k = [key_lengths(shape, p) for shape, p in ragged]
        offsets = [[nk - nq for nq, nk in zip(a, b)] for a, b in zip(q, k)]  # the causal/window mask's diagonal
        assert all(len(set(x)) == len(x) >= 4 for x in q + k + offsets) and all(min(x) >= 1 for x in q)
        assert ragged[0][0]["h_kv"] == 2 and ragged[0][0] == dict(ragged[1][0], seqlen=ragged[0][0]["seqlen"])
        _assert_some_draw_tells(q, "query lengths", seed)
        _assert_some_draw_tells(k, "key lengths", seed)
        _assert_some_draw_tells(offsets, "query-to-key offsets", seed)
        # a dense batch (sequence b at b * max_seqlen): the offsets differ from cu_seqlens in both draws
        for lens in q + k:
            cu = [sum(lens[:b]) for b in range(len(lens))]
            assert any(c != b * max(lens) for b, c in enumerate(cu))


@pytest.mark.parametrize("params", [{}, {"seqlens": "spread"}, {"seqlens": [300]}, {"page_size": 16},
                                    {"page_size": 256, "causal": True}])
def test_mla_draws_catch_a_kernel_reading_another_sequences_cache_length(params):
    """The MLA analogue (cache_seqlens per sequence): two draws with the ranks reversed, 1, a page boundary and
    one past it in each, all distinct; one case scales the softmax down and the other up."""
    fam = get_family("mla_decode")
    if fam.check_params(dict(params)):
        pytest.skip(f"params {params} not accepted: {fam.check_params(dict(params))}")
    from kernels.mla_decode import _page_size, _softmax_scale

    page = _page_size(params)
    for seed in range(300):
        cases = fam.structure_cases([{"batch": 2, "s_q": 1, "h_q": 16, "seqlen_k": 100}], dict(params),
                                    random.Random(seed))
        ragged = [over for kind, _shape, over in cases if kind.startswith("structure_seqlens")]
        assert len(ragged) == 2, [c[0] for c in cases]
        shapes = [shape for kind, shape, _over in cases if kind.startswith("structure_seqlens")]
        assert shapes[0] == shapes[1]  # the same launch (row tiles, splits) in both draws
        draws = [over["seqlens"] for over in ragged]
        assert all(len(set(d)) == len(d) >= 4 and {1, page, page + 1} <= set(d) for d in draws), draws
        _assert_some_draw_tells(draws, "cache lengths", seed)
        factors = sorted(over["softmax_scale"] / _softmax_scale(params) for over in ragged)
        assert factors[0] < 0.81 and factors[1] > 1.24, factors


@pytest.mark.parametrize("ratio", [1, 2, 3, 4, 6, 8, 16])
def test_the_other_gqa_ratio_is_larger_and_not_a_power_of_two(ratio):
    """A kernel right only up to the spec's GQA ratio, or only for power-of-two ratios (heads packed and padded
    to a power of two, a shift for the KV-head map), is wrong on the second GQA case, whatever the draw."""
    fam = get_family("attention")
    for seed in range(100):
        cases = fam.structure_cases([{"batch": 2, "seqlen": 64, "h_q": 2 * ratio, "h_kv": 2, "head_dim": 64}], {},
                                    random.Random(seed))
        ratios = [shape["h_q"] // shape["h_kv"] for kind, shape, _o in cases if kind.startswith("structure_gqa")]
        assert ratios[0] == ratio and len(ratios) == 2
        other = ratios[1]
        assert other > ratio and other & (other - 1), (seed, ratios)
        assert all(fam.check_shape_values(shape) is None for kind, shape, _o in cases)


def test_structure_cases_vary_what_indexing_depends_on():
    rng = random.Random(1)
    masked = get_family("grouped_gemm_fp8").structure_cases([{"groups": 2, "m": 40, "N": 32, "K": 128}],
                                                           {"layout": "masked"}, rng)
    sizes = [c[2]["group_sizes"] for c in masked]
    assert all(0 in s and 40 in s and len(s) >= 4 and max(s) <= 40 for s in sizes) and sizes[0] != sizes[1]
    contig = get_family("grouped_gemm_fp8").structure_cases([{"groups": 2, "m": 40, "N": 32, "K": 128}],
                                                           {"layout": "contiguous"}, rng)
    assert any(s % 128 for c in contig for s in c[2]["group_sizes"]) and all(0 in c[2]["group_sizes"] for c in contig)
    # a group that fills its 128-row blocks exactly, last in the second draw: the layout's last row is valid
    # (mutant C6: a bound off by one on the last row survived without it)
    last = contig[1][2]["group_sizes"][-1]
    assert last and last % 128 == 0 and all(any(s and s % 128 == 0 for s in c[2]["group_sizes"]) for c in contig)
    attn = get_family("attention")
    cases = attn.structure_cases([{"batch": 2, "seqlen": 64, "h_q": 8, "h_kv": 2, "head_dim": 64}], {}, rng)
    ratios = {c[1]["h_q"] // c[1]["h_kv"] for c in cases if c[0].startswith("structure_gqa")}
    assert 4 in ratios and len(ratios) == 2 and all(c[1]["h_kv"] == 2 for c in cases if c[0].startswith("structure_gqa"))
    assert any(c[1]["seqlen"] + c[2].get("prefix", [0])[0] >= 4096 and c[1]["h_q"] == 1 for c in cases)
    mla = get_family("mla_decode")
    cases = mla.structure_cases([{"batch": 2, "s_q": 1, "h_q": 16, "seqlen_k": 100}], {}, rng)
    assert any(c[2]["seqlens"] == [c[1]["seqlen_k"]] and c[1]["seqlen_k"] >= 4096 for c in cases)
    assert any(c[2].get("softmax_scale", 576 ** -0.5) != 576 ** -0.5 for c in cases)  # a run-time scalar varied


def test_hidden_shapes_keep_the_gqa_ratio():
    fam = get_family("attention")
    shapes = [{"batch": 2, "seqlen": 40, "h_q": 8, "h_kv": 2, "head_dim": 64}]
    groups = shape_groups(fam, shapes, [{"batch": 4, "seqlen": 512, "h_q": 8, "h_kv": 2, "head_dim": 64}], False,
                          random.Random(3), [1, 2, 3], {})
    for g in groups:
        for s in g["shapes"]:
            if not g["kind"].startswith("structure"):
                assert (s["h_q"], s["h_kv"]) == (8, 2), (g["kind"], s)
    assert any(g["kind"].startswith("structure_gqa") for g in groups)


@pytest.mark.parametrize("grid", [(256, 1, 1), (12, 4, 1), (9, 17, 3), (1, 1, 1), (3, 1, 1), (1000, 2, 1)])
def test_the_program_sample_covers_every_residue_class(grid):
    rng = random.Random(7)
    for _ in range(20):
        picks = sample_programs(grid, rng)
        assert all(0 <= p[i] < grid[i] for p in picks for i in range(3))
        assert (0, 0, 0) in picks and tuple(n - 1 for n in grid) in picks
        for axis in range(3):
            seen = {p[axis] for p in picks}
            if grid[axis] <= 16:
                assert seen == set(range(grid[axis]))
            for m in (16, 8, 3):
                if grid[axis] >= 16:
                    assert {x % m for x in seen} == set(range(m)), (grid, axis, m)
            if grid[axis] >= 256:
                assert all({x % m for x in seen} == set(range(m)) for m in (5, 7)), (grid, axis)


def test_compile_failures_carry_the_compilers_message():
    text = "at 12:8:\ndef k(x):\n    y = undefined_name + 1\n        ^\nNameError('undefined_name is not defined')"
    msg = compile_error_text(text)
    assert msg.startswith("NameError('undefined_name is not defined')") and "at 12:8" in msg and "y = undefined_name + 1" in msg


@pytest.mark.parametrize("family,correctness,timed,key,step", [
    ("gemm", [{"M": 67, "N": 45, "K": 33}], [{"M": 1024, "N": 1024, "K": 1024}], "K", 1),
    ("gemm_fp8", [{"M": 40, "N": 48, "K": 256}], [{"M": 512, "N": 512, "K": 1024}], "K", 128),
    ("mla_decode", [{"batch": 2, "s_q": 1, "h_q": 16, "seqlen_k": 70}], [{"batch": 4, "s_q": 1, "h_q": 16, "seqlen_k": 1024}],
     "seqlen_k", 1),
])
def test_a_case_goes_past_the_timed_reduction(family, correctness, timed, key, step):
    fam = get_family(family)
    groups = shape_groups(fam, correctness, timed, False, random.Random(5), [1, 2, 3], {})
    past = [s for g in groups if g["kind"] == f"past_{key}" for s in g["shapes"]]
    assert past and past[0][key] > max(t[key] for t in timed) and past[0][key] % step == 0
    assert all(past[0][k] == min(c[k] for c in correctness) for k in fam.shape_keys if k != key)


def _idle_varlen(grid):
    """Programs past a sequence's end do nothing, as in packed varlen attention: row tile x of sequence z
    works only if x >= cut[z] (heaviest tiles first), a third to two thirds of the grid idle per sequence."""
    nx, _ny, nz = grid
    cut = [int(nx * (0.3 + 0.4 * ((z * 0.618) % 1.0))) if nz > 1 else nx // 3 for z in range(nz)]
    return lambda p: p[0] >= cut[p[2]]


@pytest.mark.parametrize("grid", [(106, 16, 2), (64, 32, 1), (9, 17, 3), (40, 1, 5)])
def test_slots_hold_one_class_and_the_choice_finds_a_working_member(grid):
    from kernels.gate_cases import STRATA, _unravel, choose_programs, program_slots, uniform_programs

    nx, ny, nz = grid
    works = _idle_varlen(grid)
    rng = random.Random(11)
    for _ in range(10):
        slots = program_slots(grid, rng)
        for slot in slots:
            assert all(0 <= p[i] < grid[i] for p in slot for i in range(3))
        wrote = {p: 32 if works(p) else 0 for slot in slots for p in slot}
        pool = uniform_programs(grid, rng, 64)
        wrote |= {p: 32 if works(p) else 0 for p in pool}
        chosen = choose_programs(slots, pool, wrote, 32, rng)
        for slot in slots:
            assert any(works(p) for p in chosen if p in slot) or not any(works(p) for p in slot), slot
        # every flattened residue mod 16 (both orders) is present among the slots' classes
        if sum(n > 1 for n in grid) >= 2 and nx * ny * nz > STRATA:
            for x_fastest in (True, False):
                lin = [(p[0] + nx * (p[1] + ny * p[2])) if x_fastest else (p[2] + nz * (p[1] + ny * p[0])) for p in chosen]
                assert {i % STRATA for i in lin} == set(range(STRATA)), (grid, x_fastest)
                assert _unravel(5, grid, x_fastest) in [_unravel(i, grid, x_fastest) for i in range(16)]
        assert sum(1 for p in pool if works(p)) == 0 or any(works(p) for p in chosen if p in pool)


def test_a_skipped_class_of_working_programs_is_run_whatever_its_form():
    """The class the sampled run must hold on: a kernel whose programs in one class (a residue of an axis,
    of either flattening, or of a mix of axes) do less work, where a third or more of the grid is idle
    (varlen). Across draws, a working program of the class is among the chosen ones: always for the axis
    and flattened classes, and for a class of an affine mix of the axes in at least 97% of draws."""
    from kernels.gate_cases import choose_programs, program_slots, uniform_programs

    grid = (106, 16, 2)
    nx, ny, nz = grid
    works = _idle_varlen(grid)
    forms = {"axis0 % 8": lambda p: p[0] % 8, "axis1 % 16": lambda p: p[1] % 16,
             "x-fastest % 8": lambda p: (p[0] + nx * (p[1] + ny * p[2])) % 8,
             "z-fastest % 16": lambda p: (p[2] + nz * (p[1] + ny * p[0])) % 16}
    mixes = {"x + 3y % 8": lambda p: (p[0] + 3 * p[1]) % 8, "2x + y + z % 8": lambda p: (2 * p[0] + p[1] + p[2]) % 8}
    rng = random.Random(5)
    missed = {k: 0 for k in list(forms) + list(mixes)}
    draws = 60
    for _ in range(draws):
        slots = program_slots(grid, rng)
        pool = uniform_programs(grid, rng, 64)
        wrote = {p: 32 if works(p) else 0 for p in {q for s in slots for q in s} | set(pool)}
        chosen = [p for p in choose_programs(slots, pool, wrote, 32, rng) if works(p)]
        for name, f in {**forms, **mixes}.items():
            for r in range(8):
                missed[name] += not any(f(p) == r for p in chosen)
    for name in forms:
        assert missed[name] == 0, (name, missed[name])
    for name in mixes:
        assert missed[name] <= 0.03 * draws * 8, (name, missed[name])


@pytest.mark.parametrize("family, shapes, params, scale_of", [
    ("mla_decode", [{"batch": 4, "s_q": 2, "h_q": 16, "seqlen_k": 150}], {"softmax_scale": 0.135234, "causal": True},
     lambda p: 0.135234),
    ("attention", [{"batch": 2, "seqlen": 40, "h_q": 4, "h_kv": 2, "head_dim": 64}], {}, lambda p: 64 ** -0.5),
])
def test_structure_cases_move_the_softmax_scale_far_from_the_specs(family, shapes, params, scale_of):
    """A kernel that ignores the run-time softmax_scale (hard-codes the spec's) must be off by more than any
    tolerance on every draw: the structure case's scale is at least 20% away from the spec's, never near it."""
    fam = get_family(family)
    for seed in range(200):
        cases = fam.structure_cases(shapes, dict(params), random.Random(seed), timed=shapes)
        scales = [over["softmax_scale"] for _k, _s, over in cases if "softmax_scale" in over]
        assert scales, [k for k, _s, _o in cases]
        # on inputs as made: x8 ("large") values make the softmax one-hot, where a scale change hardly shows
        assert all(over.get("_gate_inputs_as_made") for _k, _s, over in cases if "softmax_scale" in over)
        assert all(abs(s / scale_of(params) - 1) >= 0.199 for s in scales), (seed, scales)


_BUDGET_CHILD = """
import json, sys
from kernels.gate_child import _job_prepare
from kregress.core.family import get_family
from kregress.core.spec import load_spec
spec = load_spec(sys.argv[1])
fam = get_family(spec.kernel_family)
big, bigger, small = ({"M": n, "N": n, "K": n} for n in (1536, 2048, 64))
group = {"id": "g0", "kind": "hidden_odd", "shapes": [big, bigger, small], "budget_s": 2.0, "seed": 3, "seed_index": 0,
         "dist": "normal", "second": None}
job = {"groups": [group], "config": spec.baseline, "params": spec.params, "correctness": spec.correctness_shapes,
       "dtype": spec.dtype, "tolerance": spec.constraints.numeric_tolerance, "device": "cpu", "reference_device": "cpu",
       "keep": False}
head, _ = _job_prepare({"family": fam, "kept": {}}, job, [])
print(json.dumps({"shapes": [c["shape"] for c in head["cases"]], "dropped": head["dropped"]}))
"""


def test_a_hidden_shape_past_the_interpreter_budget_gives_way_to_a_smaller_one():
    """Every kept case runs once per candidate on the interpreter, so a hidden shape drawn large (MLA 13x7x67x617 took
    ~60 s a candidate) costs minutes a judgement. The class: any family, any budgeted group: the baseline's run is
    cut at the budget (the reference child's own alarm), shapes with no less work are not tried, the next smaller
    one is used, and the report says so."""
    import json
    import os
    import subprocess
    import sys

    spec = Path(__file__).parent / "redteam" / "families" / "specs" / "gemm.yaml"
    res = subprocess.run([sys.executable, "-c", _BUDGET_CHILD, str(spec)], env={**os.environ, "TRITON_INTERPRET": "1"},
                         capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["shapes"] == [{"M": 64, "N": 64, "K": 64}], got
    note = [d for d in got["dropped"] if "past the interpreter budget" in d]
    assert note and "1536x1536x1536: the baseline's run took over 2.0s" in note[0], got["dropped"]
    assert "2048x2048x2048: no less work than a shape past the budget" in note[0]  # never run


REDTEAM_SPECS = sorted((Path(__file__).parent / "redteam" / "families" / "specs").glob("*.yaml"))
_WIDER_CHILD = """
import json, math, random, sys
import kernels.gate_cases as gc
from kernels.dtypes import TORCH_DTYPES
from kernels.gate_cases import _launch_grids, wider_shapes
from kregress.core.family import get_family
from kregress.core.spec import load_spec
out = {}
probed = []
probe = gc._grids_or_none
gc._grids_or_none = lambda fam, shape, *a: probed.append(fam.bytes_moved(shape, 2, {})) or probe(fam, shape, *a)
for path in sys.argv[1:]:
    spec = load_spec(path)
    fam = get_family(spec.kernel_family)
    dtype, params, config = TORCH_DTYPES[spec.dtype], dict(spec.params), dict(spec.baseline)
    runs = []
    for seed in range(2):
        probed.clear()
        shapes = wider_shapes(fam, spec.shape_matrix, spec.correctness_shapes, config, dtype, params, 4, random.Random(seed))
        runs.append([{"shape": s, "ok": fam.check_shape(s) is None, "grids": _launch_grids(fam, s, config, dtype, params),
                      "flops": fam.flops(s, params), "bytes": fam.bytes_moved(s, 2, {}),
                      "largest_probe": max(probed)} for s in shapes])
    out[path] = {"timed": [_launch_grids(fam, s, config, dtype, params) for s in spec.shape_matrix], "runs": runs,
                 "timed_bytes": max(fam.bytes_moved(s, 2, {}) for s in spec.shape_matrix),
                 "timed_flops": max(fam.flops(s, params) for s in spec.shape_matrix),
                 "timed_shapes": list(spec.shape_matrix),
                 "family": spec.kernel_family, "layout": dict(spec.params).get("layout"),
                 "reductions": list(getattr(fam, "reduction_keys", ())),
                 "structure": list(getattr(fam, "structure_keys", ())), "smallest": {k: min(c[k] for c in spec.correctness_shapes)
                                                                                 for k in fam.shape_keys}}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def wider():
    """wider_shapes on every red-team family spec, 2 draws each, in a child with TRITON_INTERPRET=1 (the launch grids
    are read from the interpreter's launches; nothing runs)."""
    import json
    import os
    import resource
    import subprocess
    import sys

    def cap_memory() -> None:  # a probe makes its shape's inputs: a derivation that doubles a dimension growing no
        # axis (MLA's batch, to thousands of sequences) ran this machine out of memory; 8 GB of address space is ample
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", _WIDER_CHILD, *map(str, REDTEAM_SPECS)], env=env, capture_output=True,
                         text=True, timeout=600, cwd=Path(__file__).resolve().parents[1], preexec_fn=cap_memory)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("path", REDTEAM_SPECS, ids=lambda p: p.stem)
def test_wider_shapes_launch_more_programs_than_any_timed_shape_on_every_axis_they_can(wider, path):
    """The class: a kernel right on every program id the spec's shapes reach and wrong past a count (``pid % 40``,
    ``min(pid, 39)``, a skip past it), on any grid axis. Every family's wider shapes grow each axis that a
    dimension can grow to four times the timed launch's or more (at least ``WIDER_MIN_PROGRAMS``), the other
    dimensions at their smallest checked values, within the cost caps; where all axes at once are past the caps, one
    shape per axis, at most ``WIDER_PARTS``. An axis whose growth is past the FLOPs cap (attention's row tiles: a
    longer sequence is quadratic) still passes the timed launches, by ``REACH_PAST`` of their programs where the
    reach cap allows, within it; the structure keeps the timed shapes' ratios at its least."""
    import math

    from kernels.gate_cases import REACH_PAST, WIDER_MAX_FLOPS, WIDER_MAX_PROGRAMS, WIDER_MIN_PROGRAMS, WIDER_PARTS, WIDER_REACH_MAX_FLOPS, WIDER_REACH_RATIO

    got = wider[str(path)]

    def pad(grids: list) -> list:
        return [list(g) + [1] * (3 - len(g)) for g in grids]

    timed = [pad(t) for t in got["timed"]]
    for shapes in got["runs"]:
        assert 1 <= len(shapes) <= WIDER_PARTS, shapes
        grown = set()
        reach_cap = max(WIDER_MAX_FLOPS, min(WIDER_REACH_MAX_FLOPS, WIDER_REACH_RATIO * got["timed_flops"]))
        for s in shapes:
            assert s["ok"] and s["flops"] <= reach_cap
            assert sum(math.prod(g) for g in s["grids"]) <= WIDER_MAX_PROGRAMS
            for i, g in enumerate(pad(s["grids"])):
                top = [max(t[i][a] for t in timed) for a in range(3)]
                for a in range(3):
                    if g[a] > top[a]:
                        full = g[a] >= min(4 * top[a], WIDER_MIN_PROGRAMS) and s["flops"] <= WIDER_MAX_FLOPS
                        # or grown under the reach cap: past the timed launches by REACH_PAST, or short of that only
                        # where the cap stops it (FLOPs grow at least linearly in a dimension: doubled, past the cap)
                        assert full or g[a] >= min(top[a] + max(2, int(REACH_PAST * top[a])), WIDER_MIN_PROGRAMS) \
                            or s["flops"] > reach_cap / 2, (s, top)
                        grown.add((i, a))
            ratio = {k: s["shape"][k] / got["timed_shapes"][0][k] for k in got["structure"]}
            assert len(set(ratio.values())) <= 1, s  # the structure's ratios kept (attention's GQA 4:1)
            # what the derivation probed (each probe makes its shape's inputs) stays small: a dimension that grows no
            # axis is never doubled on and on (MLA's batch: thousands of sequences, out of memory), nor one past the
            # cost caps (attention's sequence: 4 GB moved)
            assert s["largest_probe"] <= max(512e6, got["timed_bytes"]), s
            for k in got["reductions"]:  # the least work per program: the reduction cut, to a length the spec checks
                assert s["shape"][k] == got["smallest"][k], (k, s)
            free = [k for k in got["smallest"] if k not in got["structure"]]
            assert all(s["shape"][k] >= got["smallest"][k] for k in free), s  # never below a checked value
            assert sum(s["shape"][k] > got["smallest"][k] for k in free) <= 2
        assert grown, shapes
        if got["family"] == "grouped_gemm_fp8" and got["layout"] == "masked":
            assert {(0, 0), (0, 1)} <= grown  # the tiles of a group and the groups: both axes
        if got["family"] == "attention":
            assert (0, 2) in grown and (0, 0) in grown  # the batch and the row tiles (past the timed ones, in reach)


def test_the_upper_picks_are_past_half_of_every_axis_and_shared_by_launches_of_one_axis():
    from kernels.gate_cases import UPPER_PICKS, upper_slots

    for seed in range(5):
        for grid in [(300, 1, 1), (48, 107, 1), (9, 17, 64), (1, 71, 2)]:
            slots = upper_slots(grid, seed)
            progs = [s[0] for s in slots]
            assert all(len(s) == 1 for s in slots) and len(set(progs)) == len(progs)
            assert (0, 0, 0) in progs and tuple(n - 1 for n in grid) in progs
            assert all(0 <= p[a] < grid[a] for p in progs for a in range(3))
            for a, n in enumerate(grid):
                seen = {p[a] for p in progs}
                if n <= UPPER_PICKS:
                    assert seen == set(range(n)), (grid, a)  # a short axis whole: every split of a split-K launch
                else:
                    assert len({v for v in seen if v >= n // 2}) >= min(UPPER_PICKS, n - n // 2), (grid, a)
        # MLA: the decode launch (1, B, splits) and its combine (1, B) run the same batches, every split of each
        decode = {p[1] for s in upper_slots((1, 71, 2), seed) for p in s if p[1] not in (0, 70)}
        combine = {p[1] for s in upper_slots((1, 71, 1), seed) for p in s if p[1] not in (0, 70)}
        assert decode == combine and len(decode) >= UPPER_PICKS - 1  # one pick may be the last program
        assert {(p[1], p[2]) for s in upper_slots((1, 71, 2), seed) for p in s} >= {(b, k) for b in decode for k in (0, 1)}


def test_a_launch_feeds_the_first_program_of_a_later_launch_that_collapses_its_axes():
    """The class: a call whose later launch reduces over an axis of an earlier one (MLA's combine over the decode's
    splits, any split count, any other axes). The earlier launch's sampled programs include its first program with
    every coordinate of each collapsed axis, so the later launch's first program (always sampled) reads only
    computed values; nothing is added where no axis collapses (one-launch families keep their draws)."""
    import random

    from kernels.gate_cases import FED_MAX, fed_slots, program_slots

    rng = random.Random(0)
    for _ in range(300):
        splits, batch, rows = rng.choice([2, 3, 4, 8, 16, 32]), rng.randrange(1, 70), rng.randrange(1, 40)
        decode, combine = (rows, batch, splits), (2 * rows, batch)
        fed = {s[0] for s in fed_slots(decode, [combine])}
        assert fed == {(0, 0, z) for z in range(splits)}, (decode, fed)
        slots = {s[0] for s in program_slots(decode, random.Random(1))} | fed
        assert all((0, 0, z) in slots for z in range(splits))  # what combine (0, 0) reads, every split
    assert fed_slots((40, 4, 1), [(80, 4)]) == [] and fed_slots((40, 4, 2), []) == []  # nothing collapses
    assert fed_slots((1, 8, 128), [(1, 8, 1)]) == []  # past FED_MAX: not fed (the case may be dropped, said in the report)
    assert len(fed_slots((3, 4, 5), [(1, 4, 1)])) == 15 <= FED_MAX  # two collapsed axes: every pair


def test_a_later_launch_tiling_an_axis_finer_runs_programs_inside_every_computed_tile():
    """The class: a call whose second launch reads what the first wrote, over the same axis in finer tiles (MLA's
    split-K decode in row tiles of BLOCK_H, its combine in tiles of 8; any such pair, any row count, any draw).
    Each upper pick of the first launch must leave the second at least one program whose whole tile it computed:
    otherwise every sampled combine reads unwritten partials, writes nothing, and the baseline itself fails the
    wider case (the case was dropped: CI, stop 50, MLA 2x7x251x70, decode 110 tiles, combine 220)."""
    import random

    from kernels.gate_cases import UPPER_PICKS, UPPER_WINDOW, upper_slots

    rng = random.Random(0)
    checked = 0
    for _ in range(400):
        t2 = rng.choice([4, 8, 16])
        t1 = t2 * rng.choice([1, 2, 4, 8])
        rows = rng.randrange(UPPER_PICKS * t1 + 1, 6000)
        batch, splits, seed = rng.randrange(1, 12), rng.randrange(1, 5), rng.randrange(1000)
        n1, n2 = -(-rows // t1), -(-rows // t2)
        first = (n1, batch, splits)
        firsts = [p for s in upper_slots(first, seed) for p in s]
        later = [p for s in upper_slots((n2, batch, 1), seed, [first]) for p in s]
        for p in firsts:
            if p[0] < n1 // 2:
                continue  # the first program (and its fixed companions): not an upper pick
            lo, hi = p[0] * t1, min((p[0] + 1) * t1, rows)
            fed = [q for q in later if q[1] == p[1] and lo <= q[0] * t2 and min((q[0] + 1) * t2, rows) <= hi]
            assert fed, (t1, t2, rows, p)
            checked += 1
        per_pick = t1 // t2 + 3  # the window: the programs over one first-launch tile, one more each side
        assert len(later) <= 2 + UPPER_PICKS * per_pick * (batch if batch <= UPPER_PICKS else 1), (t1, t2, rows)
    assert checked > 1000 and UPPER_WINDOW >= 8
