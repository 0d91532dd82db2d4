"""The online-softmax step shared by the attention kernels (``attention``, ``mla_decode``).

One key block's update of the running row max ``m_i``, row sum ``l_i`` and output accumulator
``acc`` (FlashAttention's online softmax, in base 2: the scores arrive already scaled by
softmax_scale * log2(e)). Triton inlines this jit function into each kernel that calls it, so the
compiled code is the same as writing it out in the kernel.

A family whose kernel calls it lists this file in its ``helper_files`` (``SOFTMAX_FILE``), so an edit
here changes the family's source hash and invalidates its compile cache.
"""

from __future__ import annotations

from pathlib import Path

import triton
import triton.language as tl

SOFTMAX_FILE = Path(__file__).resolve()


@triton.jit
def online_softmax_step(acc, l_i, m_i, qk, v):
    """(acc, l_i, m_i) after the scores ``qk`` [rows, keys] (-inf where not visible) and values ``v`` [keys, D]."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen nothing yet
    p = tl.math.exp2(qk - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, l_i, m_new
