"""The repository-level tests' collection rule: the all-plugins compile gate
(``test_kernel_gate_all_plugins.py``) gates only what no plugin's own gate test gates in the
same session.

Each plugin's own gate tests run in its distribution's test run too
(``scripts/check_distributions.sh``), so they keep their builds; in the root run, which collects
them beside the all-plugins gate, a root gate item whose build (:func:`volta_devkit.gate.
build_key`) a plugin's gate test compiles for the same target is deselected: every distinct
build and check is collected once. Run alone, the all-plugins gate keeps every item. The plugin
tests listed check at least what the root test checks at their target (``assert_gate_passes``
at sm_70, a compile at sm_90); a test missing from this table only costs a repeated build.
"""

from __future__ import annotations

import pytest

from volta_core.host.types import CudaKernelConfig, KernelConfig
from volta_devkit.gate import build_key

_ROOT = "tests/test_kernel_gate_all_plugins.py::"

#: The all-plugins gate's tests, by the capability each compiles its parameter for.
ROOT_GATES = {
    f"{_ROOT}test_declared_kernel_config_passes_sm70_gate": 70,
    f"{_ROOT}test_h100_kernel_config_compiles_for_sm90": 90,
    f"{_ROOT}test_declared_cuda_build_passes_sm70_gate": 70,
}

#: The plugins' own gate tests whose parameter is a build, by the capability they compile it for.
PLUGIN_GATES = {
    "plugins/attn_v100/tests/test_gate.py::test_sm70_gate": 70,
    "plugins/attn_v100/tests/test_gate.py::test_scores_ahead_configs_compile_for_sm90": 90,
    "plugins/attn_v100/tests/test_cuda_decode.py::test_sm70_gate": 70,
    "plugins/attn_v100/tests/test_cuda_prefill.py::test_sm70_gate": 70,
    "plugins/ct_wna16/tests/test_gate.py::test_sm70_gate": 70,
    "plugins/ct_wna16/tests/test_gate.py::"
    "test_sm90_swapped_moe_builds_compile_for_sm90_without_spills": 90,
    "plugins/ct_wna16/tests/test_gate.py::"
    "test_sm90_one_launch_decode_builds_compile_for_sm90_without_spills": 90,
    "plugins/fp8kv/tests/test_gate.py::test_every_sm70_config_passes_the_gate": 70,
}


def _gated(item: pytest.Item, table: dict[str, int]) -> tuple[int, tuple[object, ...]] | None:
    """``(capability, build key)`` of a gate item listed in ``table``, else None."""
    capability = table.get(item.nodeid.split("[", 1)[0])
    callspec = getattr(item, "callspec", None)
    if capability is None or callspec is None:
        return None
    for value in callspec.params.values():
        if isinstance(value, KernelConfig | CudaKernelConfig):
            return capability, build_key(value)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gated = {key for item in items if (key := _gated(item, PLUGIN_GATES)) is not None}
    repeated = [item for item in items if _gated(item, ROOT_GATES) in gated]
    if repeated:
        config.hook.pytest_deselected(items=repeated)
        dropped = set(repeated)
        items[:] = [item for item in items if item not in dropped]
