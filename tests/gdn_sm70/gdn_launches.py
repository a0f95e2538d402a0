"""The Triton launches a Qwen3.5 / Qwen3.6 Gated DeltaNet layer makes, read off the installed
vLLM family's own host code at the models' shapes, for the SM70 gate.

The layer (vLLM's ``gdn_linear_attn.py`` in 0.19, ``mamba/gdn/qwen_gdn_linear_attn.py`` in
0.33 and 1Cat-vLLM) calls: the causal conv1d (``causal_conv1d_fn`` on a prefill,
``causal_conv1d_update`` on a decode), the gating (``fused_gdn_gating`` where the layer defines
it, ``fused_post_conv_prep`` where the FLA package has it), the chunked delta rule
(``chunk_gated_delta_rule``: l2norm, chunk_local_cumsum, chunk_scaled_dot_kkt, solve_tril,
recompute_w_u, chunk_gated_delta_rule_fwd_h, chunk_fwd_o) on a prefill, the recurrent update
(``fused_sigmoid_gating_delta_rule_update``; ``fused_recurrent_gated_delta_rule_packed_decode``
with VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE) on a decode, and the gated RMSNorm
(``rmsnorm_fn``). Each is called here on CPU tensors of the layer's shapes under
:func:`volta_devkit.launch_capture.recording_launches`, so the kernels, constexprs and autotune
configurations are the family's own, as its code picks them on a V100 (see :func:`as_v100`).

The family's modules are loaded afresh from its files (never the already imported ones): a
CPU build of vLLM hands its modules a Triton placeholder (``vllm.triton_utils``), and the
SM70 schedules 1Cat-vLLM picks at import must see a V100.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

#: The planner's bundled Qwen3.5-27B example (its text config is the published one).
EXAMPLE = (
    Path(__file__).resolve().parents[2]
    / "core/src/volta_core/planner/examples/qwen3.5-27b-w4a16.json"
)

#: Qwen3.5-35B-A3B's linear-attention geometry, from its published config.json
#: (https://huggingface.co/Qwen/Qwen3.5-35B-A3B/blob/main/config.json, text_config).
QWEN35_35B_A3B = {
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
}

#: What a V100 answers when the family's code asks about the device (SXM2: 80 SMs, 96 KB of
#: shared memory per block).
V100_CAPABILITY = (7, 0)
V100_SMS = 80
V100_NAME = "Tesla V100-SXM2-32GB"

#: A prefill chunk (vLLM's default long-prefill chunk is 2048 tokens) and decode batches that
#: move 1Cat-vLLM's recurrent BV choice through all its candidates (it depends on the batch).
PREFILL_TOKENS = 2048
DECODE_BATCHES = (1, 8, 64)
TP_SIZES = (1, 2, 4)


@dataclass(frozen=True)
class Shape:
    """One rank's share of a GDN layer: key heads, value heads, head dims, conv width."""

    model: str
    tp: int
    key_heads: int
    value_heads: int
    head_k: int
    head_v: int
    conv_width: int

    @property
    def label(self) -> str:
        return f"{self.model} TP{self.tp}"

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_heads * self.head_k + self.value_heads * self.head_v


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text config of a planner example (its ``config``) or an HF config."""
    inner = config.get("config", config)
    return dict(inner.get("text_config", inner))


def shapes() -> list[Shape]:
    """Qwen3.5-27B (from the bundled example) and 35B-A3B at TP 1, 2 and 4."""
    models = {
        "27B": text_config(json.loads(EXAMPLE.read_text())),
        "35B-A3B": QWEN35_35B_A3B,
    }
    out = []
    for model, cfg in models.items():
        for tp in TP_SIZES:
            out.append(
                Shape(
                    model,
                    tp,
                    int(cfg["linear_num_key_heads"]) // tp,
                    int(cfg["linear_num_value_heads"]) // tp,
                    int(cfg["linear_key_head_dim"]),
                    int(cfg["linear_value_head_dim"]),
                    int(cfg["linear_conv_kernel_dim"]),
                )
            )
    return out


# -- the device the family's code sees --------------------------------------------------------


@contextlib.contextmanager
def as_v100() -> Iterator[None]:
    """While open, torch answers the device questions the family's code asks as a V100 does.

    1Cat-vLLM chooses its SM70 schedules from ``torch.cuda.get_device_capability()`` at import
    and from the SM count per call; its recurrent kernel also asks that the tensors be on a
    CUDA device, which CPU tensors are not (:func:`_answer_device_questions`). Upstream's
    choices (``check_shared_mem``: 96 KB is under its 100 KB threshold,
    as on a CPU; not Hopper) come out the same on a CPU.
    """
    props = types.SimpleNamespace(multi_processor_count=V100_SMS, name=V100_NAME, major=7, minor=0)
    patches: dict[str, Any] = {
        "is_available": lambda: True,
        "get_device_capability": lambda device=None: V100_CAPABILITY,
        "get_device_properties": lambda device=None: props,
        "get_device_name": lambda device=None: V100_NAME,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
    }
    from triton.backends.nvidia.driver import CudaDriver

    saved = {name: getattr(torch.cuda, name) for name in patches}
    current_index = torch.accelerator.current_device_index
    is_active = CudaDriver.is_active
    try:
        for name, fn in patches.items():
            setattr(torch.cuda, name, fn)
        torch.accelerator.current_device_index = lambda: 0  # type: ignore[assignment]
        # Triton's CUDA driver would believe torch and look for libcuda: it stays inactive,
        # as on the CPU (the gate compiles for an explicit target, never the active one).
        CudaDriver.is_active = staticmethod(lambda: False)  # type: ignore[method-assign]
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.cuda, name, fn)
        torch.accelerator.current_device_index = current_index  # type: ignore[assignment]
        CudaDriver.is_active = is_active  # type: ignore[method-assign]


def _answer_device_questions(modules: list[types.ModuleType]) -> None:
    """The two device questions the loaded modules ask vLLM, not torch: the SM count
    (``num_compute_units``, from vLLM's platform, which on a CPU build has none) and, in
    1Cat-vLLM, ``_is_sm70_device(device)``, which wants a CUDA tensor before it reads the
    capability: both answered as for the layer's tensors on a V100."""
    for module in modules:
        if hasattr(module, "num_compute_units"):
            module.num_compute_units = lambda device_id=None: V100_SMS
        if hasattr(module, "_is_sm70_device"):
            module._is_sm70_device = lambda device: torch.cuda.get_device_capability() == (7, 0)


# -- loading the family's sources ---------------------------------------------------------------


def vllm_root() -> Path:
    """The installed ``vllm`` package's folder, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("no vllm package is installed in this environment")
    return Path(next(iter(spec.submodule_search_locations)))


def fla_ops_dir(root: Path) -> Path:
    """Where the family keeps FLA's ops: ``model_executor/layers/fla/ops`` (0.19, 1Cat) or
    ``third_party/flash_linear_attention/ops`` (0.32 on)."""
    for rel in ("model_executor/layers/fla/ops", "third_party/flash_linear_attention/ops"):
        if (root / rel / "chunk.py").is_file():
            return root / rel
    raise RuntimeError(f"{root} holds no FLA ops package (looked for fla/ops/chunk.py)")


def gdn_layer_file(root: Path) -> Path:
    for rel in (
        "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py",
        "model_executor/layers/mamba/gdn_linear_attn.py",
    ):
        if (root / rel).is_file():
            return root / rel
    raise RuntimeError(f"{root} holds no Qwen GDN layer module")


class V100Platform:
    """vLLM's ``current_platform`` as the loaded modules see it: the CUDA platform on a V100
    (capability 7.0, no programmatic dependent launch, not Hopper or Blackwell); anything
    else is asked of the real one."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def is_cpu(self) -> bool:
        return False

    def is_cuda(self) -> bool:
        return True

    def is_cuda_alike(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_arch_support_pdl(self) -> bool:
        return False  # programmatic dependent launch needs sm_90

    def get_device_capability(self, device_id: int = 0) -> Any:
        from vllm.platforms.interface import DeviceCapability

        return DeviceCapability(*V100_CAPABILITY)

    def is_device_capability(self, capability: Any, device_id: int = 0) -> bool:
        return _as_int(capability) == 70

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        return capability // 10 == 7

    def has_device_capability(self, capability: Any, device_id: int = 0) -> bool:
        return _as_int(capability) <= 70

    def num_compute_units(self, device_id: int = 0) -> int:
        return V100_SMS


def _as_int(capability: Any) -> int:
    return capability if isinstance(capability, int) else 10 * capability[0] + capability[1]


@contextlib.contextmanager
def _as_on_v100() -> Iterator[None]:
    """``vllm.triton_utils`` with Triton itself in it and ``current_platform`` a V100's, for
    the modules imported meanwhile (they keep both)."""
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice
    import vllm.platforms as platforms
    import vllm.triton_utils as utils

    saved = {k: getattr(utils, k) for k in ("triton", "tl", "tldevice", "HAS_TRITON")}
    real_platform = platforms.current_platform
    utils.triton, utils.tl, utils.tldevice, utils.HAS_TRITON = triton, tl, tldevice, True
    platforms._current_platform = V100Platform(real_platform)
    try:
        with as_v100():
            yield
    finally:
        for k, v in saved.items():
            setattr(utils, k, v)
        platforms._current_platform = real_platform


def _load(path: Path, name: str, package: bool = False) -> types.ModuleType:
    location = path / "__init__.py" if package else path
    spec = importlib.util.spec_from_file_location(
        name, location, submodule_search_locations=[str(path)] if package else None
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {location}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _functions_from(path: Path, names: tuple[str, ...], namespace: dict[str, Any]) -> dict:
    """The named top-level functions of ``path``, decorators included, run in ``namespace``:
    the layer module itself registers custom ops on import, so only its kernels are taken."""
    tree = ast.parse(path.read_text())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return {n: namespace[n] for n in names if n in namespace}


@dataclass
class Family:
    """The installed family's GDN entry points, loaded for a V100."""

    root: Path
    ops: types.ModuleType
    conv: types.ModuleType
    gating: Callable[..., Any] | None
    post_conv_prep: Callable[..., Any] | None
    rmsnorm_fn: Callable[..., Any]


def load_family(root: Path | None = None) -> Family:
    """Load the family under ``root`` (default: the installed vllm) afresh, as on a V100."""
    import triton
    import triton.language as tl

    root = root or vllm_root()
    ops_dir = fla_ops_dir(root)
    tag = f"_volta_gdn_{abs(hash(str(root)))}"
    with _as_on_v100():
        ops = _load(ops_dir, f"{tag}_fla", package=True)
        for sub in ("layernorm_guard", "fused_gdn_prefill_post_conv"):
            if (ops_dir / f"{sub}.py").is_file():
                importlib.import_module(f"{tag}_fla.{sub}")
        conv = _load(root / "model_executor/layers/mamba/ops/causal_conv1d.py", f"{tag}_conv")
    namespace: dict[str, Any] = {"torch": torch, "triton": triton, "tl": tl}
    gating = _functions_from(
        gdn_layer_file(root), ("fused_gdn_gating_kernel", "fused_gdn_gating"), namespace
    ).get("fused_gdn_gating")
    loaded = [m for n, m in sys.modules.items() if n.startswith(tag) and m is not None]
    _answer_device_questions(loaded)
    prep_module = sys.modules.get(f"{tag}_fla.fused_gdn_prefill_post_conv")
    return Family(
        root,
        ops,
        conv,
        gating,
        getattr(prep_module, "fused_post_conv_prep", None),
        sys.modules[f"{tag}_fla.layernorm_guard"].rmsnorm_fn,
    )


# -- the layer's calls --------------------------------------------------------------------------


def _h(*size: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.zeros(*size, dtype=dtype)


def _conv_state(slots: int, s: Shape) -> torch.Tensor:
    """The conv cache as the layer hands it over: stored (slot, width - 1, dim), passed
    transposed, so the channel stride is 1."""
    return _h(slots, s.conv_width - 1, s.conv_dim).transpose(-1, -2)


def prefill(family: Family, shape: Shape, tokens: int = PREFILL_TOKENS) -> None:
    """One sequence's prefill chunk through the layer's kernels (conv, gating, chunked rule,
    norm), with an initial state, as ``_forward_core`` calls them."""
    s, t = shape, tokens
    mixed = _h(s.conv_dim, t)
    conv_state = _conv_state(4, s)
    cu = torch.tensor([0, t], dtype=torch.int32)
    family.conv.causal_conv1d_fn(
        mixed,
        _h(s.conv_dim, s.conv_width),
        None,
        activation="silu",
        conv_states=conv_state,
        has_initial_state=torch.ones(1, dtype=torch.bool),
        cache_indices=torch.zeros(1, dtype=torch.int32),
        query_start_loc=cu,
    )
    a, b = _h(t, s.value_heads), _h(t, s.value_heads)
    a_log, dt_bias = _h(s.value_heads, dtype=torch.float32), _h(s.value_heads)
    if family.gating is not None:
        family.gating(a_log, a, b, dt_bias)
    if family.post_conv_prep is not None:
        family.post_conv_prep(
            conv_output=_h(t, s.conv_dim),
            a=a,
            b=b,
            A_log=a_log,
            dt_bias=dt_bias,
            num_k_heads=s.key_heads,
            head_k_dim=s.head_k,
            head_v_dim=s.head_v,
            apply_l2norm=True,
            output_g_exp=False,
        )
    family.ops.chunk_gated_delta_rule(
        q=_h(1, t, s.key_heads, s.head_k),
        k=_h(1, t, s.key_heads, s.head_k),
        v=_h(1, t, s.value_heads, s.head_v),
        g=_h(1, t, s.value_heads, dtype=torch.float32),
        beta=_h(1, t, s.value_heads),
        initial_state=_h(1, s.value_heads, s.head_v, s.head_k, dtype=torch.float32),
        output_final_state=True,
        cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True,
    )
    family.rmsnorm_fn(
        _h(t * s.value_heads, s.head_v),
        _h(s.head_v),
        None,
        z=_h(t * s.value_heads, s.head_v),
        eps=1e-6,
        group_size=None,
        norm_before_gate=True,
    )


def decode(family: Family, shape: Shape, batch: int) -> None:
    """One decode step of ``batch`` sequences through the layer's decode kernels (conv update,
    recurrent update, and the packed recurrent decode the layer takes when enabled)."""
    s, n = shape, batch
    slots = torch.arange(n, dtype=torch.int32)
    state = _h(n, s.value_heads, s.head_v, s.head_k, dtype=torch.float32)
    family.conv.causal_conv1d_update(
        _h(n, s.conv_dim),
        _conv_state(n, s),
        _h(s.conv_dim, s.conv_width),
        None,
        "silu",
        conv_state_indices=slots,
        validate_data=False,
    )
    a, b = _h(n, s.value_heads), _h(n, s.value_heads)
    a_log, dt_bias = _h(s.value_heads, dtype=torch.float32), _h(s.value_heads)
    family.ops.fused_sigmoid_gating_delta_rule_update(
        A_log=a_log,
        a=a,
        b=b,
        dt_bias=dt_bias,
        q=_h(1, n, s.key_heads, s.head_k),
        k=_h(1, n, s.key_heads, s.head_k),
        v=_h(1, n, s.value_heads, s.head_v),
        initial_state=state,
        inplace_final_state=True,
        cu_seqlens=torch.arange(n + 1, dtype=torch.int32),
        ssm_state_indices=slots,
        use_qk_l2norm_in_kernel=True,
    )
    family.ops.fused_recurrent_gated_delta_rule_packed_decode(
        mixed_qkv=_h(n, s.conv_dim),
        a=a,
        b=b,
        A_log=a_log,
        dt_bias=dt_bias,
        scale=s.head_k**-0.5,
        initial_state=state,
        out=_h(n, 1, s.value_heads, s.head_v),
        ssm_state_indices=slots,
        use_qk_l2norm_in_kernel=True,
    )


def record(family: Family, shape: Shape) -> dict[str, list[Any]]:
    """The launches of a prefill chunk and of each decode batch at ``shape``, by phase."""
    from volta_devkit.launch_capture import recording_launches

    phases: dict[str, list[Any]] = {}
    with as_v100():
        with recording_launches() as log:
            prefill(family, shape)
        phases["prefill"] = log.launches
        for batch in DECODE_BATCHES:
            with recording_launches() as log:
                decode(family, shape, batch)
            phases[f"decode{batch}"] = log.launches
    return phases
