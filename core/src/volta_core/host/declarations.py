"""The rules on declared names: well formed, not vLLM's own unless replacing, never shared.

Declared names (attention backends, quant methods, reasoning parsers) are how users, flags and
vLLM's registries refer to what a plugin provides, so two providers of one name would make the
engine's choice depend on installation order. The rule is independent of order: when a second
plugin declares a name another already holds, *both* are disabled with one error naming both,
and the name stays contested, so a third declarer does not win either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from volta_core.errors import DuplicateDeclarationError
from volta_core.host import builtins
from volta_core.host.answers import InvalidAnswer, check_names
from volta_core.host.types import AttentionBackendSpec, KVCacheOpsSpec

#: The canonical dtypes a KV cache stores (``auto`` and ``fp8`` are spelled out first).
CACHE_DTYPES = frozenset({"float16", "bfloat16", "float32", "fp8_e4m3", "fp8_e5m2"})


@dataclass(frozen=True)
class Family:
    """One family of declarations: its hook, the label listings use, vLLM's reserved names."""

    hook: str
    label: str
    reserved: frozenset[str]


FAMILIES: tuple[Family, ...] = (
    Family("volta_attention_backends", "attention backend", builtins.RESERVED_BACKENDS),
    Family("volta_quant_methods", "quant method", builtins.QUANT_METHODS),
    Family("volta_reasoning_parsers", "reasoning parser", builtins.REASONING_PARSERS),
    Family("volta_kv_cache_ops", "KV-cache format", frozenset()),
)


def check_own(family: Family, declarations: Sequence[Any]) -> tuple[str, ...]:
    """One plugin's declarations of a family: well formed, unique, vLLM's names only to replace.

    Returns the declared names. Raises :class:`InvalidAnswer` (a name, an impl path, a backend
    claiming to be built in, a reserved name without ``replaces_builtin``) or
    :class:`DuplicateDeclarationError` (a name declared twice by the plugin).
    """
    names: list[str] = []
    for decl in declarations:
        check_names(family.label, decl)
        if isinstance(decl, AttentionBackendSpec) and decl.builtin:
            raise InvalidAnswer(
                f"attention backend {decl.name!r} is marked builtin, which only vLLM's own "
                "backends are (volta_core.host.builtins)"
            )
        if isinstance(decl, KVCacheOpsSpec) and decl.kv_cache_dtype not in CACHE_DTYPES:
            raise InvalidAnswer(
                f"KV-cache format {decl.name!r}: the dtype is not one of "
                f"{', '.join(sorted(CACHE_DTYPES))}"
            )
        if decl.name in family.reserved and not decl.replaces_builtin:
            raise InvalidAnswer(
                f"{family.label} {decl.name!r} is vLLM's own; a plugin may take that name only "
                "by declaring replaces_builtin=True"
            )
        names.append(decl.name)
    if len(set(names)) != len(names):
        raise DuplicateDeclarationError(f"declares a {family.label} name twice: {names}")
    return tuple(names)


@dataclass
class NameRegistry:
    """Who holds each declared name, and which names are contested (declared by two or more)."""

    holders: dict[tuple[str, str], str] = field(default_factory=dict)
    contested: dict[tuple[str, str], list[str]] = field(default_factory=dict)

    def clashes(
        self, provides: Mapping[str, Sequence[str]], source: str
    ) -> list[tuple[str, str, list[str]]]:
        """``(label, name, other sources)`` for each of ``provides`` already held or contested."""
        found = []
        for label, names in provides.items():
            for name in names:
                key = (label, name)
                others = list(self.contested.get(key, ()))
                holder = self.holders.get(key)
                if holder is not None and holder != source:
                    others.append(holder)
                if others:
                    found.append((label, name, others))
        return found

    def hold(self, provides: Mapping[str, Sequence[str]], source: str) -> None:
        for label, names in provides.items():
            for name in names:
                self.holders[(label, name)] = source

    def contest(self, label: str, name: str, sources: Sequence[str]) -> None:
        """Mark a name contested: released by its holder, refused to every later declarer."""
        self.holders.pop((label, name), None)
        listed = self.contested.setdefault((label, name), [])
        listed += [s for s in sources if s not in listed]

    def release(self, source: str) -> None:
        for key in [k for k, holder in self.holders.items() if holder == source]:
            del self.holders[key]
