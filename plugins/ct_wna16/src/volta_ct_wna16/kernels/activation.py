"""The gated activation between the fused-MoE gate/up and down launches."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def silu_mul_kernel(h_ptr, out_ptr, INTER, stride_h, stride_o, BLOCK: tl.constexpr):
    """``out[r, c] = SiLU(h[r, c]) * h[r, INTER + c]``, ``SiLU(g) = g / (1 + exp(-g))``, in
    fp32, stored in the output's dtype, for ``BLOCK`` columns of row ``r``.

    vLLM's ``SiluAndMul`` (``vllm/model_executor/layers/activation.py``) on the gate/up output
    (``gate`` its first ``INTER`` columns, ``up`` the next): the down projection's input, in
    one launch where torch takes a slice conversion, a SiLU, a product and a cast.
    """
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < INTER
    g = tl.load(h_ptr + row * stride_h + c, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(h_ptr + row * stride_h + INTER + c, mask=ok, other=0.0).to(tl.float32)
    act = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * stride_o + c, act.to(out_ptr.dtype.element_ty), mask=ok)
