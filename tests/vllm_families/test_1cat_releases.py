"""1Cat-vLLM releases recognised by their touchpoints, against real 1Cat-vLLM sources.

``scripts/check_vllm.sh 1cat SRC`` installs 1Cat-vLLM's sources as ``1cat-vllm`` 1.3.0. The same
sources declared as the current release (1.5.1, under the old and the new distribution name) are
served, since 1.4-1.5 keep every touchpoint the adapter reads; with any one touchpoint taken out
of the sources the adapter reads, the release is refused with that touchpoint named.
"""

from __future__ import annotations

import re

import pytest

from volta_core.vllm import devices, families, platform, platform_class

INSTALLED = families.installed_vllm()
if INSTALLED is None or families.family_of(INSTALLED) is None or INSTALLED[0] != "1cat-vllm":
    pytest.skip(
        "1Cat-vLLM releases: the installed vLLM is not 1Cat-vLLM (scripts/check_vllm.sh 1cat "
        "SOURCE_DIR installs it)",
        allow_module_level=True,
    )
CURRENT = next(f for f in families.FAMILIES if f.name == "1Cat-vLLM 1.4-1.5")


@pytest.fixture
def as_release(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The installed sources, declared as 1Cat-LLM 1.5.1 on a V100 box."""
    monkeypatch.setattr(families, "installed_vllm", lambda: ("1cat-llm", "1.5.1"))
    monkeypatch.setattr(families, "_family", None)
    monkeypatch.setattr(devices, "nvml_capabilities", lambda: [(7, 0)])
    return monkeypatch


@pytest.mark.parametrize("distribution", ["1cat-vllm", "1cat-llm"])
def test_the_sources_as_the_current_release_are_served(
    as_release: pytest.MonkeyPatch, distribution: str
) -> None:
    as_release.setattr(families, "installed_vllm", lambda: (distribution, "1.5.1"))
    assert families.missing_touchpoints(CURRENT) == []
    assert families.unsupported_reason() is None
    assert families.family() is CURRENT
    assert platform.detect() == platform_class.PLATFORM_QUALNAME


@pytest.mark.parametrize("point", CURRENT.touchpoints(), ids=str)
def test_a_touchpoint_taken_out_is_refused_by_name(
    as_release: pytest.MonkeyPatch, point: families.Touchpoint
) -> None:
    real = families.module_source
    name = re.compile(rf"\b{re.escape(point.attribute.split('.')[-1])}\b")

    def without(module: str) -> str | None:
        source = real(module)
        return name.sub("Removed", source) if source and module == point.module else source

    as_release.setattr(families, "module_source", without)
    assert families.missing_touchpoints(CURRENT) == [point]
    reason = families.unsupported_reason()
    assert reason is not None
    assert f"lacks what the Volta adapter reads from it: {point};" in reason
    assert platform.detect() is None
