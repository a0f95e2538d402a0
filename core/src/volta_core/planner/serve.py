"""The command that serves a plan: ``vllm serve`` with the plan's knobs, per vLLM family.

The line carries what the plan chose or its fit suggested: ``--tensor-parallel-size`` (above 1),
``--dtype`` (the activation dtype the plan runs), ``--kv-cache-dtype`` (unless ``auto``),
``--max-model-len`` (the fit's; when only a shorter one fits, the longest that does),
``--max-num-seqs``, ``--max-num-batched-tokens`` and ``--gpu-memory-utilization`` (the ones the
fit counted: 1Cat-vLLM's serving profile would otherwise pick one or four sequences),
``--block-size`` (unless 16), ``--attention-backend`` only where one was named (auto mode lets
the Volta platform choose per layer; a family's own backend, 1Cat-vLLM's ``FLASH_ATTN_V100``,
runs only when named), the reasoning parser ``qwen3-volta`` for Qwen3-family models where a
plugin provides it, the MTP speculative config, and ``--cudagraph-capture-sizes``: the sizes the
fit's reserve counts, covering every decode batch up to ``--max-num-seqs``
(:func:`volta_core.planner.reserve.capture_sizes`).

Tensor parallelism over PCIe only (``--interconnect pcie``, the default: most V100 boxes are
PCIe cards) adds ``NCCL_P2P_DISABLE=1`` and ``--disable-custom-all-reduce``: peer-to-peer
transfers and vLLM's custom all-reduce hang or fail at start on many such boxes (1Cat-vLLM
issues 42 and 652); NCCL's own all-reduce through host memory avoids both.

Every flag has the same name in each family's ``EngineArgs.add_cli_args``
(``vllm/engine/arg_utils.py`` of vLLM 0.19.1, 0.32 and 1Cat-vLLM 1.3; 1.4-1.5's line is 1.3's,
whose sources are the only 1Cat ones checked here). What differs per family is in
:data:`DIALECTS`. The families are named as ``volta_core.vllm.families`` names them (the
planner does not import the adapter; a test keeps the two in step).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from volta_core.errors import UsageError
from volta_core.host.builtins import NAMED_ONLY_BACKENDS
from volta_core.host.manager import VoltaPluginManager
from volta_core.planner.fit import Fit, FitOptions
from volta_core.planner.plan import Plan

INTERCONNECTS = ("pcie", "nvlink")
#: The reasoning parser the ``reasoning`` plugin registers for Qwen3-family models.
QWEN3_PARSER = "qwen3-volta"
#: vLLM's default block size on CUDA (not repeated on the line).
DEFAULT_BLOCK_SIZE = 16
_FP8_WEIGHTS_ENV = "VLLM_VOLTA_FP8_WEIGHTS"
_AWQ_GPTQ_WEIGHTS_ENV = "VLLM_VOLTA_AWQ_GPTQ_WEIGHTS"
_AWQ_GPTQ = ("awq", "awq_marlin", "auto_awq", "gptq", "gptq_marlin", "auto_gptq")


@dataclass(frozen=True)
class Dialect:
    """What a vLLM family's serve line needs beyond the common flags."""

    family: str
    backends: frozenset[str] = frozenset()
    """Attention backends of the family's own that exist nowhere else (named-only builtins)."""
    plugin_weights_env: Mapping[str, str] = field(default_factory=dict)
    """Per ``quant_method`` the family runs with its own SM70 kernels: the variable that, set
    to ``plugin``, gives the layers to the plugin the plan chose for them."""


_ONECAT_WEIGHTS = MappingProxyType(
    {"fp8": _FP8_WEIGHTS_ENV, **dict.fromkeys(_AWQ_GPTQ, _AWQ_GPTQ_WEIGHTS_ENV)}
)

DIALECTS: tuple[Dialect, ...] = (
    Dialect("vLLM 0.19"),
    Dialect("1Cat-vLLM 1.2-1.3", frozenset({"FLASH_ATTN_V100"}), _ONECAT_WEIGHTS),
    Dialect("1Cat-vLLM 1.4-1.5", frozenset({"FLASH_ATTN_V100"}), _ONECAT_WEIGHTS),
    Dialect("vLLM 0.32-0.33"),
)


@dataclass(frozen=True)
class ServeOptions:
    """Where the plan is served: the model argument, the box's interconnect, the family."""

    model: str
    """What ``vllm serve`` takes: the checkpoint directory (a bundled example's name when
    ``example``)."""
    interconnect: str = "pcie"
    family: str | None = None
    """The installed vLLM family's name; None: a line for each family."""
    example: bool = False

    def __post_init__(self) -> None:
        if self.interconnect not in INTERCONNECTS:
            raise UsageError(
                f"unknown --interconnect {self.interconnect!r} (one of: {', '.join(INTERCONNECTS)})"
            )


@dataclass(frozen=True)
class ServeCommand:
    """One command line: environment variables, then ``vllm serve MODEL`` and its flags."""

    families: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]

    @property
    def line(self) -> str:
        env = [f"{name}={shlex.quote(value)}" for name, value in self.env]
        return " ".join([*env, shlex.join(self.argv)])

    def as_dict(self) -> dict[str, Any]:
        return {
            "families": list(self.families),
            "env": dict(self.env),
            "argv": list(self.argv),
            "line": self.line,
        }


@dataclass
class Serve:
    """The serve commands of a plan, or why there is none (``refused``)."""

    interconnect: str
    commands: list[ServeCommand] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    refused: str | None = None

    def lines(self) -> list[str]:
        lines = ["serve (run where the GPUs are, after vllm-volta doctor):"]
        if self.refused is not None:
            lines.append(f"  none: {self.refused}")
        for command in self.commands:
            lines.append(f"  {' and '.join(command.families)}:")
            lines.append(f"    {command.line}")
        lines += [f"  note: {note}" for note in self.notes]
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "interconnect": self.interconnect,
            "commands": [c.as_dict() for c in self.commands],
            "notes": list(self.notes),
            "refused": self.refused,
        }


_MAX_MODEL_LEN_KNOB = re.compile(r"^--max-model-len (\d+)$")


def serve_commands(
    plan: Plan,
    fit: Fit | None,
    fit_options: FitOptions,
    manager: VoltaPluginManager,
    options: ServeOptions,
) -> Serve:
    """The commands that serve ``plan`` as fitted (module doc), one per family that needs a
    different line; none where the fit holds no setting to serve."""
    serve = Serve(options.interconnect)
    if fit is None:
        serve.refused = "the model has no layers to plan"
        return serve
    max_model_len = fit.max_model_len
    if not fit.fits:
        shorter = [m for s in fit.suggestions if (m := _MAX_MODEL_LEN_KNOB.match(s))]
        if not shorter:
            serve.refused = (
                "the model fits at no setting (see the memory fit)"
                if fit.impossible
                else "it does not fit as planned: plan again with one of the knobs that make it fit"
            )
            return serve
        max_model_len = int(shorter[0].group(1))
        serve.notes.append(
            f"--max-model-len {max_model_len}: the longest context that fits as planned "
            "(the fit's other knobs need planning again)"
        )
    if plan.problems:
        serve.notes.append("the engine would refuse this plan as it stands: see the problems")
    if options.example:
        serve.notes.append(
            f"{options.model} is a bundled example (a config, no weights): put its checkpoint's "
            "directory in its place"
        )
    flags = _common_flags(plan, fit, fit_options, manager, max_model_len)
    env: list[tuple[str, str]] = []
    tp = plan.options.tensor_parallel_size
    if tp > 1 and options.interconnect == "pcie":
        env.append(("NCCL_P2P_DISABLE", "1"))
        flags.append("--disable-custom-all-reduce")
        serve.notes.append(
            "PCIe-only box (--interconnect pcie, the default): NCCL peer-to-peer and vLLM's "
            "custom all-reduce off; with NVLink between the GPUs plan with --interconnect nvlink"
        )
    known = {d.family: d for d in DIALECTS}
    dialects = list(DIALECTS)
    if options.family is not None:
        if options.family in known:
            dialects = [known[options.family]]
        else:
            serve.notes.append(
                f"installed {options.family}: no serve dialect known for it, so a line for each "
                "known family"
            )
    backend = plan.options.attention_backend
    family_only = {spec.name for spec in NAMED_ONLY_BACKENDS}
    grouped: dict[tuple[tuple[tuple[str, str], ...], tuple[str, ...]], list[str]] = {}
    for dialect in dialects:
        if backend in family_only and backend not in dialect.backends:
            serve.notes.append(f"{dialect.family}: has no --attention-backend {backend}")
            continue
        key = (tuple(env + _weights_env(plan, dialect)), tuple(flags))
        grouped.setdefault(key, []).append(dialect.family)
    for (command_env, command_flags), families in grouped.items():
        argv = ("vllm", "serve", options.model, *command_flags)
        serve.commands.append(ServeCommand(tuple(families), command_env, argv))
    if not serve.commands:
        serve.refused = f"no vLLM family here has --attention-backend {backend}"
    return serve


def _common_flags(
    plan: Plan,
    fit: Fit,
    fit_options: FitOptions,
    manager: VoltaPluginManager,
    max_model_len: int,
) -> list[str]:
    """The flags every family takes by the same name (module doc)."""
    o = plan.options
    flags = []
    if o.tensor_parallel_size > 1:
        flags += ["--tensor-parallel-size", str(o.tensor_parallel_size)]
    flags += ["--dtype", plan.activation_dtype]
    if o.kv_cache_dtype != "auto":
        flags += ["--kv-cache-dtype", o.kv_cache_dtype]
    flags += [
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(fit_options.max_num_seqs),
        "--max-num-batched-tokens",
        str(fit_options.max_num_batched_tokens),
        "--gpu-memory-utilization",
        f"{fit_options.gpu_memory_utilization:g}",
    ]
    if o.block_size != DEFAULT_BLOCK_SIZE:
        flags += ["--block-size", str(o.block_size)]
    if o.attention_backend is not None:
        flags += ["--attention-backend", o.attention_backend]
    if plan.model.model_type.startswith("qwen3") and any(
        spec.name == QWEN3_PARSER for _, spec in manager.reasoning_parsers()
    ):
        flags += ["--reasoning-parser", QWEN3_PARSER]
    if fit_options.speculative_tokens:
        config = {"method": "mtp", "num_speculative_tokens": fit_options.speculative_tokens}
        flags += ["--speculative-config", json.dumps(config)]
    if fit.capture_sizes:
        flags += ["--cudagraph-capture-sizes", *(str(s) for s in fit.capture_sizes)]
    return flags


def _weights_env(plan: Plan, dialect: Dialect) -> list[tuple[str, str]]:
    """``VAR=plugin`` where the family runs the checkpoint's format itself but the plan gives
    its layers to a plugin (the plan, its estimate and its fit are for the plugin's kernels)."""
    quant = plan.model.quant
    if quant is None or quant.method not in dialect.plugin_weights_env:
        return []
    if not any(q.plugin is not None for q in plan.quant):
        return []
    return [(dialect.plugin_weights_env[quant.method], "plugin")]
