"""The memory fit and the speed estimates of ``vllm-volta plan``, put together.

:func:`assess` sizes the planned model (:mod:`volta_core.planner.fit`), looks for the knobs that
make it fit when it does not, and estimates its V100 decode speed
(:mod:`volta_core.planner.estimate`; only for an SM7x device), at the requested batch and at the
concurrency the plan serves: one stream and ``--max-num-seqs`` streams, or as many as the KV
cache holds at that context where fewer (:class:`Streams`), and the prefill of a
``--prompt-tokens`` prompt (the time to first token). A model that fits at no setting adds a
problem to the plan (exit 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from volta_core.errors import UsageError
from volta_core.host.manager import VoltaPluginManager
from volta_core.planner.estimate import (
    PrefillEstimate,
    SpeedAssumptions,
    SpeedEstimate,
    estimate_decode,
    estimate_prefill,
    render_prefill,
    render_speed,
)
from volta_core.planner.fit import Fit, FitOptions, Sizer, render_fit
from volta_core.planner.model import ModelDescription, text_config
from volta_core.planner.plan import Plan


@dataclass(frozen=True)
class SpeedRequest:
    """What the speed estimate is asked for: batch, context (None: max-model-len), MTP, and
    the prompt whose prefill is estimated (None: the context)."""

    batch: int = 1
    context: int | None = None
    speculative_tokens: int = 0
    acceptance: float = 0.7
    assumptions: SpeedAssumptions = field(default_factory=SpeedAssumptions)
    prompt: int | None = None

    def __post_init__(self) -> None:
        a = self.assumptions
        if self.batch < 1:
            raise UsageError("--batch must be at least 1")
        if self.prompt is not None and self.prompt < 1:
            raise UsageError(f"--prompt-tokens {self.prompt} must be at least 1")
        if not 0 <= self.acceptance <= 1:
            raise UsageError(f"--acceptance {self.acceptance} is not in [0, 1]")
        if min(a.hbm_gbps, a.pcie_gbps) <= 0 or min(a.allreduce_us, a.launch_us) < 0:
            raise UsageError("--hbm-gbps and --pcie-gbps must be positive, latencies not negative")


@dataclass(frozen=True)
class Streams:
    """The decode estimate at one stream and at the streams served together, at one context.

    ``kv_sequences`` is how many sequences of that context the KV cache holds at once. vLLM's
    scheduler admits a request only when its KV blocks can be allocated, and preempts one when
    the cache runs out (``vllm/v1/core/sched/scheduler.py``), so at most that many of the
    ``--max-num-seqs`` streams decode together and the rest wait: :attr:`served` streams, the
    batch the last estimate is for.
    """

    context: int
    max_num_seqs: int
    kv_sequences: int
    estimates: tuple[SpeedEstimate, ...]

    @property
    def served(self) -> int:
        """Streams that decode together: ``--max-num-seqs``, or fewer where the KV cache holds
        fewer sequences of the context (one at least: a cache too small for one sequence is
        the fit's problem)."""
        return served_streams(self.max_num_seqs, self.kv_sequences)

    def lines(self) -> list[str]:
        first = self.estimates[0]
        lines = [
            f"speed per stream at the served concurrency (ESTIMATE for V100, context "
            f"{self.context}, tensor parallel {first.tp}"
            + (f", {first.speculative_tokens} MTP draft tokens" if first.speculative_tokens else "")
            + ")"
        ]
        for e in self.estimates:
            streams = f"{e.batch} stream{'s' if e.batch > 1 else ''}"
            lines.append(
                f"  {streams:>12}: {e.per_sequence_tokens_per_second:8.1f} tokens/s per stream, "
                f"{e.tokens_per_second:8.1f} tokens/s in all ({e.step_seconds * 1e3:.1f} ms "
                "per step)"
            )
        if self.kv_sequences < self.max_num_seqs:
            lines.append(
                f"  the KV cache holds {self.kv_sequences} sequences of {self.context} tokens at "
                f"once: of --max-num-seqs {self.max_num_seqs} streams {self.served} decode "
                f"together and the rest wait, so the figures are for {self.served}, not "
                f"{self.max_num_seqs}"
            )
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": "estimate (SM70 roofline sum, not a measurement)",
            "context": self.context,
            "max_num_seqs": self.max_num_seqs,
            "kv_sequences_at_context": self.kv_sequences,
            "served_streams": self.served,
            "streams": [
                {
                    "streams": e.batch,
                    "step_ms": round(e.step_seconds * 1e3, 3),
                    "tokens_per_second_per_stream": round(e.per_sequence_tokens_per_second, 2),
                    "tokens_per_second": round(e.tokens_per_second, 2),
                }
                for e in self.estimates
            ],
        }


def served_streams(max_num_seqs: int, kv_sequences: int) -> int:
    """The streams that decode together: ``max_num_seqs`` capped at the ``kv_sequences`` the KV
    cache holds (:class:`Streams`), one at least."""
    return max(1, min(max_num_seqs, kv_sequences))


@dataclass
class Capacity:
    """A plan's fit and speed estimates (None where the model has no layers to size, and the
    speeds where the device is not SM7x)."""

    fit: Fit | None = None
    fit_options: FitOptions | None = None
    speed: SpeedEstimate | None = None
    streams: Streams | None = None
    prefill: PrefillEstimate | None = None

    def sections(self) -> list[list[str]]:
        out = []
        if self.fit is not None and self.fit_options is not None:
            out.append(render_fit(self.fit, self.fit_options))
        if self.speed is not None:
            out.append(render_speed(self.speed))
        if self.prefill is not None:
            out.append(render_prefill(self.prefill))
        if self.streams is not None:
            out.append(self.streams.lines())
        return out

    def as_dict(self) -> dict[str, Any]:
        speed = self.speed.as_dict() if self.speed else None
        if speed is not None:
            speed["prefill"] = self.prefill.as_dict() if self.prefill else None
        return {
            "fit": self.fit.as_dict() if self.fit else None,
            "speed": speed,
            "streams": self.streams.as_dict() if self.streams else None,
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
    prompt = speed.prompt if speed.prompt is not None else context
    if prompt > sizer.max_model_len:
        raise UsageError(
            f"--prompt-tokens {prompt} is longer than --max-model-len {sizer.max_model_len}"
        )
    fit = sizer.fit(plan)
    sizer.suggest(fit)
    if fit.impossible:
        plan.problems.append(f"cannot fit at any setting: {fit.impossible}")
    if plan.options.device.capability[0] != 7:
        return Capacity(fit, fit_options)

    def at(batch: int) -> SpeedEstimate:
        return estimate_decode(
            fit,
            plan,
            manager,
            text,
            batch,
            context,
            speed.assumptions,
            speed.speculative_tokens,
            speed.acceptance,
        )

    seqs = fit_options.max_num_seqs
    kv_sequences = int(max(0, fit.kv_available) // max(1, fit.need(context)))
    served = served_streams(seqs, kv_sequences)
    estimates = {batch: at(batch) for batch in sorted({1, served, speed.batch})}
    streams = Streams(
        context,
        seqs,
        kv_sequences,
        (estimates[1], estimates[served]) if served > 1 else (estimates[1],),
    )
    prefill = estimate_prefill(
        fit,
        plan,
        manager,
        text,
        prompt,
        fit_options.max_num_batched_tokens,
        speed.assumptions,
    )
    return Capacity(fit, fit_options, estimates[speed.batch], streams, prefill)
