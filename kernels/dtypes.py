"""Dtype names of a spec (``dtype: bf16``) -> torch dtypes, element sizes and Triton pointer types.

One table for every family and for the measurement code; a family that takes more dtypes (fp8) adds
them here, so the maps never drift apart.
"""

from __future__ import annotations

import torch

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
                "fp8_e4m3": torch.float8_e4m3fn}  # e4m3 inputs of the fp8 GEMMs (output bf16)
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8_e4m3": 1}
TRITON_PTR = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32", "fp8_e4m3": "*fp8e4nv"}
