"""The memory fit and the decode-speed estimate of ``vllm-volta plan``, put together.

:func:`assess` sizes the planned model (:mod:`volta_core.planner.fit`), looks for the knobs that
make it fit when it does not, and estimates its V100 decode speed
(:mod:`volta_core.planner.estimate`; only for an SM7x device). A model that fits at no setting
adds a problem to the plan (exit 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from volta_core.errors import UsageError
from volta_core.host.manager import VoltaPluginManager
from volta_core.planner.estimate import (
    SpeedAssumptions,
    SpeedEstimate,
    estimate_decode,
    render_speed,
)
from volta_core.planner.fit import Fit, FitOptions, Sizer, render_fit
from volta_core.planner.model import ModelDescription, text_config
from volta_core.planner.plan import Plan


@dataclass(frozen=True)
class SpeedRequest:
    """What the speed estimate is asked for: batch, context (None: max-model-len), MTP."""

    batch: int = 1
    context: int | None = None
    speculative_tokens: int = 0
    acceptance: float = 0.7
    assumptions: SpeedAssumptions = field(default_factory=SpeedAssumptions)

    def __post_init__(self) -> None:
        a = self.assumptions
        if self.batch < 1:
            raise UsageError("--batch must be at least 1")
        if not 0 <= self.acceptance <= 1:
            raise UsageError(f"--acceptance {self.acceptance} is not in [0, 1]")
        if min(a.hbm_gbps, a.pcie_gbps) <= 0 or min(a.allreduce_us, a.launch_us) < 0:
            raise UsageError("--hbm-gbps and --pcie-gbps must be positive, latencies not negative")


@dataclass
class Capacity:
    """A plan's fit and speed estimate (None where the model has no layers to size)."""

    fit: Fit | None = None
    fit_options: FitOptions | None = None
    speed: SpeedEstimate | None = None

    def sections(self) -> list[list[str]]:
        out = []
        if self.fit is not None and self.fit_options is not None:
            out.append(render_fit(self.fit, self.fit_options))
        if self.speed is not None:
            out.append(render_speed(self.speed))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "fit": self.fit.as_dict() if self.fit else None,
            "speed": self.speed.as_dict() if self.speed else None,
        }


def assess(
    plan: Plan,
    model: ModelDescription,
    raw: Mapping[str, Any],
    fit_options: FitOptions,
    speed: SpeedRequest,
    manager: VoltaPluginManager,
    checkpoint: Path | None,
) -> Capacity:
    """Fit ``plan`` at ``fit_options`` and estimate its speed; ``checkpoint``: a directory
    whose safetensors headers give the weights (None: the config estimate)."""
    if not model.layers:
        return Capacity()
    text = text_config(model.name, raw)
    sizer = Sizer(model, raw, text, plan.options, fit_options, manager, checkpoint)
    context = speed.context if speed.context is not None else sizer.max_model_len
    if not 1 <= context <= sizer.max_model_len:
        raise UsageError(
            f"--context {context} is not between 1 and --max-model-len {sizer.max_model_len}"
        )
    fit = sizer.fit(plan)
    sizer.suggest(fit)
    if fit.impossible:
        plan.problems.append(f"cannot fit at any setting: {fit.impossible}")
    estimate = None
    if plan.options.device.capability[0] == 7:
        estimate = estimate_decode(
            fit,
            plan,
            manager,
            text,
            speed.batch,
            context,
            speed.assumptions,
            speed.speculative_tokens,
            speed.acceptance,
        )
    return Capacity(fit, fit_options, estimate)
