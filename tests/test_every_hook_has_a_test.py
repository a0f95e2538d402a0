"""Every hook in the host's spec is answered by the installed plugins on the host's own paths.

One manager is discovered as a user's environment loads it (no test plugins), with pluggy's
call monitoring (``pm.add_hookcall_monitoring``) recording, per hook, which plugin gave a real
answer (not ``None``, not an empty list) in a call that did not raise. It is then driven as
production drives it: ``vllm-volta plan`` on every bundled example with an e5m2 KV cache
(declarations, quant claims, the KV verdict, kernel paths and costs), ``vllm-volta bench``'s
list of calls for each (their bench cases), the compile gate's build lists, and the reasoning
post-processor on a result cut by ``max_tokens``. Each plugin implementing a hook must have
answered it at least once, so a hook that is named in a test but never reached, or a plugin
whose implementation always passes, fails here.
"""

from __future__ import annotations

import contextlib
import inspect
import io
from collections import defaultdict
from typing import Any

import pluggy
import pytest

from volta_core import V100
from volta_core import cli as cli_module
from volta_core.bench.cases import QUICK, plan_cases
from volta_core.host import hookspecs
from volta_core.host.discovery import discover
from volta_core.host.manager import VoltaPluginManager
from volta_core.host.types import ReasoningContext, ReasoningSplit
from volta_core.planner.model import describe_model, example_names, read_config
from volta_core.planner.plan import PlanOptions, make_plan

HOOKS = sorted(
    name
    for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
    if name.startswith("volta_")
)

#: What a hook's plugins answered: hook -> plugins that gave a real answer at least once.
Answers = dict[str, set[str]]


def test_the_spec_has_the_declaration_families_the_resolutions_and_the_gate_hook() -> None:
    assert HOOKS == [
        "volta_attention_backends",
        "volta_bench_case",
        "volta_cuda_kernel_configs",
        "volta_kernel_configs",
        "volta_kernel_cost",
        "volta_kernel_paths",
        "volta_kv_cache_ops",
        "volta_kv_cache_verdict",
        "volta_quant_method",
        "volta_quant_methods",
        "volta_reasoning_parsers",
        "volta_reasoning_postprocess",
    ]


def _monitored(answers: Answers) -> Any:
    """A manager factory whose pluggy manager records every real answer into ``answers``."""

    def after(
        outcome: pluggy.Result[Any],
        hook_name: str,
        hook_impls: list[pluggy.HookImpl],
        kwargs: dict[str, Any],
    ) -> None:
        if outcome.exception is not None or not outcome.get_result():
            return
        for impl in hook_impls:
            if not (impl.wrapper or impl.hookwrapper):
                answers[hook_name].add(impl.plugin_name)

    def factory(**options: Any) -> VoltaPluginManager:
        manager = VoltaPluginManager(**options)
        manager.pm.add_hookcall_monitoring(lambda *_: None, after)
        return manager

    return factory


@pytest.fixture(scope="module")
def driven() -> tuple[VoltaPluginManager, Answers]:
    """The installed plugins' manager after the production paths ran, and what answered."""
    answers: Answers = defaultdict(set)
    manager = discover({}, _monitored(answers))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli_module, "get_plugin_manager", lambda: manager)
        for example in example_names():
            with contextlib.redirect_stdout(io.StringIO()):
                cli_module.main(["plan", example, "--kv-cache-dtype", "fp8_e5m2"])
            name, raw = read_config(example)
            options = PlanOptions(device=V100, kv_cache_dtype="fp8_e5m2")
            plan_cases(manager, make_plan(describe_model(name, raw), options, manager), name, QUICK)
    manager.kernel_configs(V100)
    manager.cuda_kernel_configs(V100)
    for _, parser in manager.reasoning_parsers():
        # What the adapter hands over for a non-streaming answer cut by max_tokens inside the
        # think block, after an engine parser blanked it (1CatAI/1Cat-vLLM#47).
        cut = ReasoningContext(
            parser=parser.name,
            text="the answer was cut here",
            token_ids=(1, 2, 3),
            finish_reason="length",
            streaming=False,
            in_reasoning=True,
        )
        manager.postprocess_reasoning(ReasoningSplit(reasoning=None, content=""), cut)
    return manager, answers


@pytest.mark.parametrize("hook", HOOKS)
def test_each_plugin_answers_its_hook_on_a_production_path(
    driven: tuple[VoltaPluginManager, Answers], hook: str
) -> None:
    manager, answers = driven
    implementing = {
        impl.plugin_name
        for impl in getattr(manager.pm.hook, hook).get_hookimpls()
        if not (impl.wrapper or impl.hookwrapper)
    }
    assert implementing, f"no installed plugin implements {hook}"
    silent = sorted(implementing - answers[hook])
    assert not silent, f"{hook}: never answered by {silent} on the paths driven here"
    assert not manager.faults, [f"{f.plugin}: {f.hook}: {f.error}" for f in manager.faults]


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented(hook: str) -> None:
    doc = inspect.getdoc(getattr(hookspecs, hook)) or ""
    assert len(doc.split()) >= 15, (
        f"{hook} needs a docstring saying when it runs and what it returns"
    )
