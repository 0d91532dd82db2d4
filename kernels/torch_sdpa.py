"""``torch_sdpa``: an external-kernel family, PyTorch's scaled_dot_product_attention and its backends.

The example of a family that wraps a compiled kernel instead of a Triton jit function (a CUDA
extension exposing ``op(q, k, v, config)`` fits the same shape). The tunable is which of PyTorch's
fused attention kernels runs (``torch.nn.attention.sdpa_kernel``): 0 math (the unfused reference
path), 1 flash attention, 2 memory-efficient attention, 3 cuDNN attention.

- No AOT compile (``external = True``): there are no Triton compile units, so no registers or shared
  memory; a family whose extension ships a cubin lists it in ``source_files()`` and the numbers come
  from cuobjdump.
- Timed by the cuda backend exactly like a Triton variant (do_bench in a child process), correctness
  against the float64 reference on the GPU.
- On a CPU host the interpreter backend refuses it with one line (it needs the cuda backend or a
  recorded file); its reference, shapes and formulas are still validated, and the backends PyTorch
  implements on the CPU (math, flash) are checked against the reference by ``kregress family check``.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch
import torch.nn.functional as F

from kregress.core.family import ExternalFamily, Space, check_bool_param, register

BACKEND_NAMES = ("math", "flash", "efficient", "cudnn")
PARAM_KEYS = ("causal",)


def _backend(index: int):
    from torch.nn.attention import SDPBackend

    return (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
            SDPBackend.CUDNN_ATTENTION)[index]


def _causal(params: dict[str, Any]) -> bool:
    return bool((params or {}).get("causal", True))


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: dict[str, int], causal: bool) -> torch.Tensor:
    """Attention with the PyTorch kernel ``config['backend']`` picks; raises if that kernel cannot run here."""
    from torch.nn.attention import sdpa_kernel

    if q.ndim != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"sdpa: q, k, v must be [batch, heads, seqlen, head_dim] alike, got {tuple(q.shape)}")
    with sdpa_kernel([_backend(config["backend"])]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


class TorchSdpaFamily(ExternalFamily):
    param_keys = PARAM_KEYS

    def check_param_values(self, params):
        return check_bool_param(params, "causal")

    def make_inputs(self, shape, dtype, device, seed, params):
        g = torch.Generator(device="cpu").manual_seed(seed)
        dims = (shape["batch"], shape["heads"], shape["seqlen"], shape["head_dim"])
        return {name: torch.randn(*dims, generator=g).to(dtype).to(device) for name in ("q", "k", "v")}

    def run(self, inputs, config, params):
        return sdpa(inputs["q"], inputs["k"], inputs["v"], config, _causal(params))

    def reference(self, inputs, params):
        q, k, v = (inputs[n].double() for n in ("q", "k", "v"))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        if _causal(params):
            n = s.shape[-1]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    def flops(self, shape, params):
        b, h, n, d = shape["batch"], shape["heads"], shape["seqlen"], shape["head_dim"]
        pairs = n * (n + 1) / 2 if _causal(params) else n * n
        return 4.0 * b * h * pairs * d

    def bytes_moved(self, shape, dtype_bytes, params):
        return float(4 * dtype_bytes * shape["batch"] * shape["heads"] * shape["seqlen"] * shape["head_dim"])

    def tolerance(self, shape, dtype, base_tol, params):
        # a convex mix of V rows; fp32 sums over the keys grow slowly with the key count
        grow = max(1.0, (shape["seqlen"] / 1024.0) ** 0.25)
        return base_tol * grow * (2.0 if dtype == "bf16" else 1.0), base_tol * (2.0 if dtype == "bf16" else 1.0)

    def compile_units(self, config, dtype, params):
        return []  # an external kernel: nothing for the Triton AOT compile


SPACE = Space(params={"backend": tuple(range(len(BACKEND_NAMES)))})

FAMILY = register(TorchSdpaFamily(name="torch_sdpa", space=SPACE, shape_keys=("batch", "heads", "seqlen", "head_dim"),
                                  headline_metric="tflops", module=sys.modules[__name__]))
