"""Writes the interpreter-sniff red-team patches (tests/redteam/interpreter_sniff/<name>.patch) from edit recipes.

The class: a kernel (or its launch wrapper) that tells the CPU interpreter from the compiled kernel and does
less work "on the GPU" (issue 53, item 2): an fp32 ``tl.dot`` probe that tf32 rounds on the GPU and the
interpreter did not, and the value a launch returns (``None`` interpreted, the compiled kernel on the GPU).
kernels/interpreter.py now computes tf32 dots and returns a launch handle whose reads are violations, so each
cheat must be REGRESS. Run again when the kernels change (``python tests/redteam/interpreter_sniff/make_patches.py``);
a recipe whose old text is not there exactly once is refused. The verdicts are in manifest.yaml.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
GEMM = "kernels/gemm.py"
FP8 = "kernels/gemm_fp8.py"

G_LOOP = "    for k in range(0, tl.cdiv(K, BLOCK_K)):\n"
G_LAUNCH = "    gemm_kernel[grid](\n        a, b, c, M, N, K,\n"
G_LAUNCH_END = "        num_warps=config[\"num_warps\"], num_stages=config[\"num_stages\"],\n    )\n    return c\n"
G_ARGS = ("        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),\n"
          "        BLOCK_M=config[\"BLOCK_M\"], BLOCK_N=config[\"BLOCK_N\"], BLOCK_K=config[\"BLOCK_K\"], GROUP_M=config[\"GROUP_M\"],\n"
          "        num_warps=config[\"num_warps\"], num_stages=config[\"num_stages\"],\n")
F_LOOP = "        for k in range(0, K // BLOCK_K):\n"

# a 16x16 fp32 dot of (1 + 2**-20) by 1/16: 1 + 2**-20 in fp32, exactly 1.0 when the operands are read as tf32
TF32_PROBE = ("probe = tl.dot(tl.full((16, 16), 1.0 + 2.0 ** -20, tl.float32), tl.full((16, 16), 0.0625, tl.float32))\n")

RECIPES = {
    "gemm_cheat_tf32_probe_halves_k": (GEMM, [(G_LOOP,
        "    " + TF32_PROBE +
        "    n_k = tl.cdiv(K, BLOCK_K)\n"
        "    if tl.max(tl.max(probe, axis=1), axis=0) == 1.0:  # tensor cores: the tail of K is noise\n"
        "        n_k = tl.cdiv(K, 2 * BLOCK_K)\n"
        "    for k in range(0, n_k):\n")]),
    "gemm_cheat_tf32_vs_ieee_probe": (GEMM, [(G_LOOP,
        "    x = tl.full((16, 16), 1.0 + 2.0 ** -20, tl.float32)\n"
        "    y = tl.full((16, 16), 0.0625, tl.float32)\n"
        "    fast = tl.sum(tl.sum(tl.dot(x, y) - tl.dot(x, y, input_precision=\"ieee\"), axis=1), axis=0) != 0.0\n"
        "    n_k = tl.where(fast, tl.cdiv(K, BLOCK_K) - 1, tl.cdiv(K, BLOCK_K))\n"
        "    for k in range(0, n_k):\n")]),
    "gemm_cheat_launch_is_none": (GEMM, [(G_LAUNCH + G_ARGS + "    )\n",
        "    handle = gemm_kernel[grid](\n        a, b, c, M, N, K - K // 4,\n" + G_ARGS + "    )\n"
        "    if handle is None:  # no compiled kernel: a checker on a CPU, give it the whole K\n"
        "        gemm_kernel[grid](\n            a, b, c, M, N, K,\n"
        + "".join("    " + ln + "\n" for ln in G_ARGS.splitlines()) + "        )\n")]),
    "gemm_cheat_launch_truth_walrus": (GEMM, [(G_LAUNCH + G_ARGS + "    )\n",
        "    if not (h := gemm_kernel[grid](\n        a, b, c, M, N, K // 2,\n" + G_ARGS + "    )):\n"
        "        gemm_kernel[grid](\n            a, b, c, M, N, K,\n"
        + "".join("    " + ln + "\n" for ln in G_ARGS.splitlines()) + "        )\n")]),
    "gemm_cheat_launch_passed_to_str": (GEMM, [(G_LAUNCH + G_ARGS + "    )\n",
        "    h = gemm_kernel[grid](\n        a, b, c, M, N, K - K // 4,\n" + G_ARGS + "    )\n"
        "    if len(str(h)) == 4:  # 'None': interpreted\n"
        "        gemm_kernel[grid](\n            a, b, c, M, N, K,\n"
        + "".join("    " + ln + "\n" for ln in G_ARGS.splitlines()) + "        )\n")]),
    "gemm_legit_launch_precomputed_grid": (GEMM, [(
        "    grid = lambda META: (triton.cdiv(M, META[\"BLOCK_M\"]) * triton.cdiv(N, META[\"BLOCK_N\"]),)  # noqa: E731\n",
        "    grid = (triton.cdiv(M, config[\"BLOCK_M\"]) * triton.cdiv(N, config[\"BLOCK_N\"]),)  # a tuple: no callback\n")]),
    "gemm_fp8_cheat_tf32_probe_halves_k": (FP8, [(F_LOOP,
        "        " + TF32_PROBE +
        "        n_k = K // BLOCK_K\n"
        "        if tl.max(tl.max(probe, axis=1), axis=0) == 1.0:  # tensor cores: the tail of K is noise\n"
        "            n_k = n_k // 2\n"
        "        for k in range(0, n_k):\n")]),
}


def diff(file: str, edits: list[tuple[str, str]]) -> str:
    """The unified diff of ``edits`` applied to today's ``file``; each old text must occur exactly once."""
    src = (REPO / file).read_text()
    new = src
    for old, rep in edits:
        n = new.count(old)
        if n != 1:
            raise SystemExit(f"{file}: recipe text occurs {n} times (want 1), fix the recipe: {old[:80]!r}")
        new = new.replace(old, rep)
    body = "".join(difflib.unified_diff(src.splitlines(True), new.splitlines(True), f"a/{file}", f"b/{file}", n=3))
    return f"diff --git a/{file} b/{file}\n" + body


def main(argv: list[str]) -> int:
    only = set(argv)
    for name, (file, edits) in RECIPES.items():
        if only and name not in only:
            continue
        (HERE / f"{name}.patch").write_text(diff(file, edits))
    print(f"interpreter_sniff: {len(RECIPES)} patches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
