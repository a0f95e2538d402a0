"""The vLLM families: 1Cat-vLLM releases recognised by the touchpoints the adapter reads, and
each 1Cat family's own ``FLASH_ATTN_V100`` limits.

The touchpoints are read from a ``vllm`` source tree written here (one file per module, each
defining what the family's adapter code imports); the real 1Cat-vLLM sources are checked the
same way by ``tests/vllm_families/test_1cat_releases.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from volta_core import Device, VoltaPluginManager
from volta_core.doctor import checks as doctor
from volta_core.doctor.checks import Status
from volta_core.errors import NoAttentionBackendError
from volta_core.host.types import AttentionLayer
from volta_core.vllm import families

NEW_1CAT = "1Cat-vLLM 1.4-1.5"
REGISTRY = "vllm.v1.attention.backends.registry"


def write_sources(root: Path, family: families.Family, leave_out: str = "") -> Path:
    """A ``vllm`` package under ``root`` whose modules define the family's touchpoints (less
    ``leave_out``), written the ways vLLM writes them: classes with members, functions,
    annotated aliases and parenthesised re-exports."""
    modules: dict[str, list[str]] = {}
    for point in family.touchpoints():
        if str(point) != leave_out:
            modules.setdefault(point.module, []).append(point.attribute)
    for module, attributes in modules.items():
        lines = ["# a comment at the top\n", "from __future__ import annotations\n"]
        classes: dict[str, list[str]] = {}
        for attribute in attributes:
            head, _, member = attribute.partition(".")
            classes.setdefault(head, [])
            if member:
                classes[head].append(member)
        for head, members in classes.items():
            if members:
                body = "".join(
                    f"    def {m}(self) -> None: ...\n"
                    if m.islower()
                    else f"    {m} = None\n# a comment between members\n"
                    for m in members
                )
                lines.append(f"class {head}:\n    '''docs'''\n{body}\n")
            elif head.startswith("_") or head.islower():
                lines.append(f"def {head}() -> None: ...\n")
            elif head.isupper():
                lines.append(f"{head}: dict[str, int] = {{}}\n")
            else:
                lines.append(f"from .elsewhere import (\n    Other,\n    {head},\n)\n")
        path = root.joinpath(*module.split("."))
        path.mkdir(parents=True, exist_ok=True)
        (path / "__init__.py").write_text("".join(lines))
    return root / "vllm"


@pytest.fixture
def new_1cat() -> families.Family:
    return next(f for f in families.FAMILIES if f.name == NEW_1CAT)


def installed(
    monkeypatch: pytest.MonkeyPatch, root: Path | None, dist: str = "1cat-llm", v: str = "1.5.1"
) -> None:
    monkeypatch.setattr(families, "installed_vllm", lambda: (dist, v))
    monkeypatch.setattr(families, "vllm_root", lambda: root)


@pytest.mark.parametrize(
    ("dist", "version", "family"),
    [
        ("1cat-vllm", "1.3.0", "1Cat-vLLM 1.2-1.3"),
        ("1cat-vllm", "1.4.2", NEW_1CAT),
        ("1cat-vllm", "1.5.1", NEW_1CAT),
        ("1cat-llm", "1.5.1", NEW_1CAT),
        ("1cat-llm", "1.7.0", NEW_1CAT),  # a later 1.x: its touchpoints decide
        ("1cat-llm", "1.3.0", None),  # the new name came with 1.4
        ("1cat-vllm", "2.0.0", None),
        ("1cat-vllm", "1.1.0", None),
    ],
)
def test_1cat_releases_by_name_and_version(dist: str, version: str, family: str | None) -> None:
    found = families.family_of((dist, version))
    assert (found.name if found else None) == family


def test_a_1cat_release_with_every_touchpoint_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new_1cat: families.Family
) -> None:
    installed(monkeypatch, write_sources(tmp_path, new_1cat))
    assert families.missing_touchpoints(new_1cat) == []
    assert families.installed_family() is new_1cat
    assert families.unsupported_reason() is None
    assert families.installed_family_name() == NEW_1CAT


@pytest.mark.parametrize(
    "removed",
    [
        f"{REGISTRY}.AttentionBackendEnum.FLASH_ATTN_V100",
        "vllm.model_executor.layers.fused_moe.RoutedExperts",
        "vllm.model_executor.layers.quantization.auto_gptq.AutoGPTQConfig",
        "vllm.model_executor.layers.attention.attention._init_kv_cache_quant",
        "vllm.model_executor.models.config.MODELS_CONFIG_MAP",
    ],
)
def test_a_1cat_release_missing_a_touchpoint_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new_1cat: families.Family, removed: str
) -> None:
    installed(monkeypatch, write_sources(tmp_path, new_1cat, leave_out=removed))
    assert [str(p) for p in families.missing_touchpoints(new_1cat)] == [removed]
    assert families.installed_family() is None
    reason = families.unsupported_reason()
    assert reason is not None
    assert f"1cat-llm 1.5.1 ({NEW_1CAT} family) lacks what the Volta adapter reads" in reason
    assert reason.endswith(f"{removed}; the Volta plugins are not applied and vLLM runs unchanged")
    # Asked about the release itself (no environment), the version alone answers.
    assert families.unsupported_reason(("1cat-llm", "1.5.1")) is None


def test_a_member_of_another_class_or_a_missing_module_is_no_touchpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new_1cat: families.Family
) -> None:
    root = write_sources(tmp_path, new_1cat)
    registry = root / "v1" / "attention" / "backends" / "registry" / "__init__.py"
    text = registry.read_text().replace("class AttentionBackendEnum", "class MambaBackendEnum")
    registry.write_text(text + "\nclass AttentionBackendEnum:\n    CUSTOM = None\n")
    (root / "reasoning" / "__init__.py").unlink()
    installed(monkeypatch, root)
    assert [str(p) for p in families.missing_touchpoints(new_1cat)] == [
        "vllm.reasoning.ReasoningParser",
        f"{REGISTRY}.AttentionBackendEnum.FLASH_ATTN_V100",
    ]


def test_members_after_an_unindented_docstring_line_are_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new_1cat: families.Family
) -> None:
    """A line at column 0 inside a class (a docstring's) ends the line scan early; the parse
    that confirms a miss finds the members after it."""
    root = write_sources(tmp_path, new_1cat)
    registry = root / "v1" / "attention" / "backends" / "registry" / "__init__.py"
    registry.write_text(
        'class AttentionBackendEnum:\n    """Backends.\nat column 0\n"""\n'
        "    CUSTOM = None\n    FLASH_ATTN_V100 = 'path'\n\n\ndef register_backend(): ...\n"
    )
    installed(monkeypatch, root)
    assert families.missing_touchpoints(new_1cat) == []


def test_upstream_families_are_judged_by_version_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, None, "vllm", "0.19.1")
    assert families.unsupported_reason() is None
    assert families.installed_family_name() == "vLLM 0.19"


@pytest.mark.parametrize(
    ("family", "kv_cache_dtype", "runs"),
    [
        ("1Cat-vLLM 1.2-1.3", "fp8_e5m2", True),
        ("1Cat-vLLM 1.2-1.3", "fp8_e4m3", False),
        (NEW_1CAT, "fp8_e4m3", True),
        (NEW_1CAT, "fp8_e5m2", True),
        (NEW_1CAT, "float16", True),
        (None, "fp8_e4m3", True),  # no vLLM here: the current 1Cat release's limits
    ],
)
def test_each_1cat_family_judges_its_own_flash_attn_v100(
    family: str | None, kv_cache_dtype: str, runs: bool
) -> None:
    """1.5's Flash-V100 declares E4M3 among its native KV codecs; 1.3's did not."""
    layer = AttentionLayer("model.layers.0.self_attn", 128, 32, 8, "float16", kv_cache_dtype)
    manager = VoltaPluginManager()
    sm70 = Device((7, 0))
    if runs:
        choice = manager.select_attention(layer, sm70, "FLASH_ATTN_V100", family)
        assert choice.backend.name == "FLASH_ATTN_V100"
    else:
        with pytest.raises(NoAttentionBackendError, match="KV-cache dtype fp8_e4m3 is not one of"):
            manager.select_attention(layer, sm70, "FLASH_ATTN_V100", family)
    for head_size in (64, 256):  # both releases: 64, 128 and 256 only
        ok = AttentionLayer("l", head_size, 32, 8, "float16", "float16")
        assert manager.select_attention(ok, sm70, "FLASH_ATTN_V100", family).backend
    big = AttentionLayer("l", 512, 32, 8, "float16", "float16")
    with pytest.raises(NoAttentionBackendError, match="head size 512"):
        manager.select_attention(big, sm70, "FLASH_ATTN_V100", family)


def test_doctor_serves_1cat_13_and_names_the_current_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = next(f for f in families.FAMILIES if f.name == "1Cat-vLLM 1.2-1.3")
    installed(monkeypatch, write_sources(tmp_path, old), "1cat-vllm", "1.3.0")
    monkeypatch.setattr(doctor, "_check_vllm_code", lambda *_: doctor.Check("k", Status.OK, ""))
    row = doctor.check_vllm(doctor.GpuProbe(None))[0]
    assert row.status is Status.OK
    assert row.detail == "1cat-vllm 1.3.0: supported (1Cat-vLLM 1.2-1.3 family)"
    assert row.notes == (
        "the current 1Cat release: 1Cat-vLLM 1.5.1 (October 2026; 1.2-1.5 are supported)",
    )
    installed(monkeypatch, write_sources(tmp_path / "new", old), "1cat-llm", "1.5.1")
    assert doctor.check_vllm(doctor.GpuProbe(None))[0].notes == ()
