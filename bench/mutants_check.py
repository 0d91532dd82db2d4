"""The independent exhaustive check of bench/mutants.py (runs in its child, under TRITON_INTERPRET=1).

It loads the original kernel module and each mutant from source files as separate modules and calls their
launch wrappers directly on cases built here: its own shapes (ragged edges; many programs so that a skip of
one program id in N lands; K and sequence lengths past the loop caps; GQA ratios 1, 2, 3 and 4; masked_m
from 0 to full; empty, single-row and 128-aligned groups; shuffled page tables with NaN in every page and
table slot a correct kernel must not read; caller buffers filled with a sentinel that must survive where
the kernel must not write) and its own float64 references with exact dequantization. Nothing here comes
from the families' make_inputs / reference or the gate's case generator.

A mutant is told apart from the original when, on some case: it raises where the original does not; a
read-only input changes; the non-finite pattern of an output differs from the reference's; or an output's
largest error against the float64 reference exceeds 3x the original's plus a floor (1e-6 of the largest
reference value), on the first call or on a second call with the buffers refilled.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
import yaml

SENTINEL = 1232.0  # (exact in bf16 and fp16) what the caller's out buffer holds where a correct kernel never writes


def _load(name: str, source: str, directory: str) -> Any:
    f = Path(directory) / f"{name}.py"
    f.write_text(source)
    spec = importlib.util.spec_from_file_location(name, f)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# --- cases: (inputs, read-only names, call(module, inputs, config) -> outputs, float64 expected) ---------


def _fp8(rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    return (torch.randn(rows, cols, generator=g) * 3.0).clamp(-440, 440).to(torch.float8_e4m3fn)


def _scales(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.exp(torch.randn(*shape, generator=g) * 0.7).float() * 0.3


def _deq_a(a: torch.Tensor, sa: torch.Tensor) -> torch.Tensor:
    return a.double() * sa.double().repeat_interleave(128, dim=-1)


def _deq_b(b: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    s = sb.double().repeat_interleave(128, dim=-1).repeat_interleave(128, dim=-2)
    return b.double() * s[..., : b.shape[-2], :]


def gemm_cases(g: torch.Generator, params: dict) -> list[dict]:
    out = []
    for M, N, K in [(67, 45, 33), (1, 1, 1), (130, 200, 100), (576, 128, 32), (200, 70, 1100), (5, 300, 96), (64, 64, 64)]:
        a = torch.randn(M, K, generator=g).half()
        b = torch.randn(K, N, generator=g).half()
        out.append({"label": f"{M}x{N}x{K}", "inputs": {"a": a, "b": b}, "outputs": [],
                    "call": lambda m, i, c: [m.matmul(i["a"], i["b"], c)],
                    "expected": [a.double() @ b.double()]})
    return out


def gemm_fp8_cases(g: torch.Generator, params: dict) -> list[dict]:
    out = []
    for M, N, K in [(70, 150, 256), (1, 64, 128), (130, 200, 1152), (256, 320, 128), (64, 64, 128), (3, 17, 384)]:
        a, b = _fp8(M, K, g), _fp8(N, K, g)
        sa, sb = _scales((M, K // 128), g), _scales((math.ceil(N / 128), K // 128), g)
        out.append({"label": f"{M}x{N}x{K}", "inputs": {"a": a, "sa": sa, "b": b, "sb": sb}, "outputs": [],
                    "call": lambda m, i, c: [m.fp8_gemm_nt(i["a"], i["sa"], i["b"], i["sb"], c)],
                    "expected": [_deq_a(a, sa) @ _deq_b(b, sb).T]})
    return out


def contiguous_cases(g: torch.Generator, params: dict) -> list[dict]:
    out = []
    for sizes, N, K in [([0, 5, 128, 130], 96, 256), ([64, 1, 200], 40, 1152), ([300, 0, 0, 17, 90], 160, 128), ([128], 64, 128)]:
        G = len(sizes)
        idx: list[int] = []
        for gi, s in enumerate(sizes):
            pad = math.ceil(s / 128) * 128 - s
            idx += [gi] * s + [-1] * pad
        total = len(idx)
        a, sa = _fp8(total, K, g), _scales((total, K // 128), g)
        b = torch.stack([_fp8(N, K, g) for _ in range(G)])
        sb = torch.stack([_scales((math.ceil(N / 128), K // 128), g) for _ in range(G)])
        grp = torch.tensor(idx, dtype=torch.int32)
        exp = torch.full((total, N), SENTINEL, dtype=torch.float64)
        da = _deq_a(a, sa)
        for gi in range(G):
            rows = (grp == gi).nonzero().flatten()
            if rows.numel():
                exp[rows] = da[rows] @ _deq_b(b[gi], sb[gi]).T
        out.append({"label": f"sizes={sizes} N={N} K={K}", "inputs": {"a": a, "sa": sa, "b": b, "sb": sb, "grp": grp,
                    "out": torch.full((total, N), SENTINEL, dtype=torch.bfloat16)}, "outputs": ["out"],
                    "call": lambda m, i, c: [m.m_grouped_fp8_gemm_nt_contiguous(i["a"], i["sa"], i["b"], i["sb"], i["grp"], c, i["out"])],
                    "expected": [exp]})
    return out


def masked_cases(g: torch.Generator, params: dict) -> list[dict]:
    out = []
    for counts, max_m, N, K in [([0, 1, 70, 33], 70, 96, 256), ([130, 64, 0], 130, 40, 1152), ([9, 9, 2, 5, 0], 9, 160, 128),
                                ([200, 199], 200, 64, 128)]:
        G = len(counts)
        a, sa = _fp8(G * max_m, K, g).view(G, max_m, K), _scales((G, max_m, K // 128), g)
        b = torch.stack([_fp8(N, K, g) for _ in range(G)])
        sb = torch.stack([_scales((math.ceil(N / 128), K // 128), g) for _ in range(G)])
        mm = torch.tensor(counts, dtype=torch.int32)
        exp = torch.full((G, max_m, N), SENTINEL, dtype=torch.float64)
        for gi, n in enumerate(counts):
            exp[gi, :n] = _deq_a(a[gi, :n], sa[gi, :n]) @ _deq_b(b[gi], sb[gi]).T
        out.append({"label": f"masked_m={counts} N={N} K={K}", "inputs": {"a": a, "sa": sa, "b": b, "sb": sb, "grp": mm,
                    "out": torch.full((G, max_m, N), SENTINEL, dtype=torch.bfloat16)}, "outputs": ["out"],
                    "call": lambda m, i, c: [m.m_grouped_fp8_gemm_nt_masked(i["a"], i["sa"], i["b"], i["sb"], i["grp"], c, i["out"])],
                    "expected": [exp]})
    return out


def _mla_ref(q, kv64, bt, lens, page, scale, causal):
    """FlashMLA's semantics: causal, query s of s_q sees keys 0..n - s_q + s (none: out 0, lse +inf); not
    causal (flash_mla_with_kvcache's default), every query sees the whole cache."""
    B, s_q, h_q, _ = q.shape
    out = torch.zeros((B, s_q, h_q, 512), dtype=torch.float64)
    lse = torch.full((B, h_q, s_q), float("inf"), dtype=torch.float64)
    for b in range(B):
        n = lens[b]
        if n == 0:
            continue
        toks = torch.cat([kv64[int(bt[b, i])] for i in range(math.ceil(n / page))])[:n]  # [n, 576]
        for s in range(s_q):
            last = n - s_q + s if causal else n - 1
            if last < 0:
                continue
            sc = q[b, s].double() @ toks[: last + 1].T * scale  # [h_q, keys]
            lse_r = torch.logsumexp(sc, dim=-1)
            out[b, s] = torch.exp(sc - lse_r[:, None]) @ toks[: last + 1, :512]
            lse[b, :, s] = lse_r
    return out, lse


def mla_cases(g: torch.Generator, params: dict, fp8: bool) -> list[dict]:
    page = int(params.get("page_size", 64))
    scale = float(params.get("softmax_scale", 576 ** -0.5))
    causal = bool(params.get("causal", False))  # the spec's flag, FlashMLA's default when absent
    out = []
    for lens, s_q, h_q in [([0, 1, 64, 1300], 2, 16), ([800, 65, 33], 1, 16), ([200, 3], 3, 16), ([1000, 129], 2, 8)]:
        B = len(lens)
        pages = [math.ceil(n / page) for n in lens]
        used, spare = sum(pages), 3
        nb = used + spare
        perm = torch.randperm(nb, generator=g).tolist()
        bt = torch.full((B, max(1, max(pages)) + 1), perm[-1], dtype=torch.int32)  # unused slots -> a NaN page
        nxt = 0
        for b, p in enumerate(pages):
            bt[b, :p] = torch.tensor(perm[nxt:nxt + p], dtype=torch.int32)
            nxt += p
        q = torch.randn(B, s_q, h_q, 576, generator=g).bfloat16()
        if fp8:
            kv = _fp8(nb * page, 576, g).view(nb, page, 1, 576)
            ks = _scales((nb, page), g)
            kv64 = (kv.double().view(nb, page, 576) * ks.double()[:, :, None])
        else:
            kv = torch.randn(nb, page, 1, 576, generator=g).bfloat16()
            kv64 = kv.double().view(nb, page, 576)
        # every token a correct kernel must not read is poisoned: spare pages, page tails
        poison = torch.zeros(nb, page, dtype=torch.bool)
        for p in perm[used:]:
            poison[p] = True
        for b, n in enumerate(lens):
            if n % page:
                poison[int(bt[b, n // page]), n % page:] = True
        kv = kv.clone()
        if fp8:
            kv.view(torch.uint8)[poison] = 0x7F  # e4m3 NaN
        else:
            kv[poison] = float("nan")
        ref = _mla_ref(q, kv64, bt, lens, page, scale, causal)
        inputs = {"q": q, "kv": kv, "bt": bt, "lens": torch.tensor(lens, dtype=torch.int32)}
        if fp8:
            inputs["ks"] = ks
        out.append({"label": f"lens={lens} s_q={s_q} h_q={h_q} causal={causal}", "inputs": inputs, "outputs": [],
                    "call": lambda m, i, c, scale=scale: list(m.mla_decode(i["q"], i["kv"], i["bt"], i["lens"], scale, c,
                                                                           kv_scale=i.get("ks"), causal=causal)),
                    "expected": list(ref)})
    return out


def _att_ref(q, k, v, lq, lk, scale):
    h_q, h_kv = q.shape[1], k.shape[1]
    grp = h_q // h_kv
    out = torch.zeros((q.shape[0], h_q, v.shape[2]), dtype=torch.float64)
    lse = torch.full((h_q, q.shape[0]), float("inf"), dtype=torch.float64)
    qs = ks = 0
    for nq, nk in zip(lq, lk):
        for h in range(h_q):
            kh = h // grp
            for i in range(nq):
                last = i + nk - nq
                sc = q[qs + i, h].double() @ k[ks: ks + last + 1, kh].double().T * scale
                r = torch.logsumexp(sc, 0)
                out[qs + i, h] = torch.exp(sc - r) @ v[ks: ks + last + 1, kh].double()
                lse[h, qs + i] = r
        qs += nq
        ks += nk
    return out, lse


def attention_cases(g: torch.Generator, params: dict) -> list[dict]:
    out = []
    for lq, prefix, h_q, h_kv in [([40, 5, 33], [0, 24, 64], 4, 2), ([70, 1], [3, 0], 6, 2), ([1100], [0], 2, 1),
                                  ([50, 20], [10, 100], 4, 4), ([36], [5], 4, 1)]:
        lk = [n + p for n, p in zip(lq, prefix)]
        q = torch.randn(sum(lq), h_q, 64, generator=g).half()
        k = torch.randn(sum(lk), h_kv, 64, generator=g).half()
        v = torch.randn(sum(lk), h_kv, 64, generator=g).half()
        cu = lambda ls: torch.tensor([0] + torch.tensor(ls).cumsum(0).tolist(), dtype=torch.int32)  # noqa: E731
        ref = _att_ref(q, k, v, lq, lk, 64 ** -0.5)
        out.append({"label": f"lq={lq} prefix={prefix} h={h_q}/{h_kv}", "outputs": [],
                    "inputs": {"q": q, "k": k, "v": v, "cq": cu(lq), "ck": cu(lk), "maxq": max(lq)},
                    "call": lambda m, i, c: list(m.attention(i["q"], i["k"], i["v"], i["cq"], i["ck"], i["maxq"], c,
                                                             window_size=(-1, 0), softmax_scale=64 ** -0.5)),
                    "expected": list(ref)})
    return out


CASES: dict[str, Callable[[torch.Generator, dict], list[dict]]] = {
    "gemm": gemm_cases,
    "gemm_fp8": gemm_fp8_cases,
    "grouped_gemm_fp8/contiguous": contiguous_cases,
    "grouped_gemm_fp8/masked": masked_cases,
    "mla_decode": lambda g, p: mla_cases(g, p, False),
    "mla_decode/fp8_kv": lambda g, p: mla_cases(g, p, True),
    "attention": attention_cases,
}


# --- comparing ---------------------------------------------------------------------------------------


def _clone(inputs: dict) -> dict:
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def _errors(outs: list, expected: list) -> list[float] | str:
    """Largest abs error per output against float64, or why the outputs cannot be compared."""
    errs = []
    for i, (o, e) in enumerate(zip(outs, expected)):
        if not isinstance(o, torch.Tensor) or tuple(o.shape) != tuple(e.shape):
            return f"output {i}: {type(o).__name__} {tuple(getattr(o, 'shape', ()))} instead of {tuple(e.shape)}"
        od = o.double()
        fin_o, fin_e = torch.isfinite(od), torch.isfinite(e)
        if not torch.equal(fin_o, fin_e):
            return f"output {i}: {int((fin_o != fin_e).sum())} elements finite/non-finite unlike the reference"
        if not torch.equal(od[~fin_e], e[~fin_e]):
            return f"output {i}: infinities of the wrong sign"
        errs.append(float((od[fin_e] - e[fin_e]).abs().max()) if fin_e.any() else 0.0)
    return errs


def _run_case(mod: Any, case: dict, config: dict) -> list[list[float] | str]:
    """Errors of two calls (buffers refilled in between), or the first problem as text."""
    results = []
    inputs = _clone(case["inputs"])
    keep = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in case["outputs"]}
    for _call in range(2):
        for name in case["outputs"]:
            inputs[name].fill_(SENTINEL)
        try:
            outs = case["call"](mod, inputs, dict(config))
        except Exception as exc:  # noqa: BLE001 - a crash is a difference, never a traceback here
            return [f"raised {type(exc).__name__}: {str(exc)[:200]}"]
        changed = [k for k, v in keep.items() if not torch.equal(inputs[k].view(torch.uint8) if inputs[k].dtype.is_floating_point else inputs[k],
                                                                  v.view(torch.uint8) if v.dtype.is_floating_point else v)]
        if changed:
            return [f"read-only input(s) {', '.join(changed)} changed"]
        results.append(_errors([o.clone() for o in outs], case["expected"]))
    return results


def run(job: dict) -> dict[str, str | None]:
    spec = yaml.safe_load(Path(job["spec"]).read_text())
    config, params = spec["baseline"], spec.get("params") or {}
    repo = Path(__file__).resolve().parents[1]
    g = torch.Generator().manual_seed(20261204)
    cases = CASES[job["key"]](g, params)
    orig = _load("kregress_mut_original", (repo / job["module"]).read_text(), job["dir"])
    base = [_run_case(orig, c, config) for c in cases]
    for c, b in zip(cases, base):
        if any(isinstance(x, str) for x in b):
            raise RuntimeError(f"the original kernel fails the check's own case {c['label']}: {b}")
    verdicts: dict[str, str | None] = {}
    progress = open(job["progress"], "a") if job.get("progress") else None

    def note(rec: dict) -> None:
        if progress:
            progress.write(json.dumps(rec) + "\n")
            progress.flush()

    for i, (name, source) in enumerate(job["mutants"].items()):
        note({"start": name})
        try:
            mod = _load(f"kregress_mut_{i}", source, job["dir"])
        except Exception as exc:  # noqa: BLE001
            verdicts[name] = f"does not import: {type(exc).__name__}: {exc}"
            note({"name": name, "why": verdicts[name]})
            continue
        why = None
        for c, b in zip(cases, base):
            got = _run_case(mod, c, config)
            for call, (gm, bm) in enumerate(zip(got, b)):
                if isinstance(gm, str):
                    why = f"[{c['label']}] call {call + 1}: {gm}"
                    break
                for j, (em, eb, ex) in enumerate(zip(gm, bm, c["expected"])):
                    fin = ex[torch.isfinite(ex) & (ex != SENTINEL)]
                    floor = 1e-6 * (float(fin.abs().max()) if fin.numel() else 1.0)
                    if em > 3.0 * eb + floor:
                        why = f"[{c['label']}] call {call + 1} output {j}: error {em:.3g} vs the original's {eb:.3g}"
                        break
                if why:
                    break
            if why:
                break
        verdicts[name] = why
        note({"name": name, "why": why})
        print(f"{name}: {'equivalent' if why is None else why}", file=sys.stderr, flush=True)
    return verdicts


if __name__ == "__main__":  # debugging: python bench/mutants_check.py JOB.json
    try:
        print(json.dumps(run(json.loads(Path(sys.argv[1]).read_text()))))
    except Exception:
        traceback.print_exc()
        raise
