"""Which config group of a compressed-tensors checkpoint covers a module, read without torch.

compressed-tensors' rules, as its writers and vLLM apply them, shared by every plugin that reads
such a checkpoint so that two plugins never disagree on which layers a group covers:

* ``ignore`` entries and ``targets`` are exact module names or ``re:`` patterns matched with
  :func:`re.match` (compressed-tensors' ``match_name``); the class-name target ``Linear`` matches
  every linear layer;
* vLLM fuses ``q/k/v_proj`` into ``qkv_proj`` and ``gate/up_proj`` into ``gate_up_proj``; a fused
  module is ignored when every shard is, and vLLM refuses shards that disagree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: vLLM's usual fused-module names and their checkpoint shards (``packed_modules_mapping``).
DEFAULT_FUSED: Mapping[str, Sequence[str]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def match_name(name: str, target: str) -> bool:
    """compressed-tensors' rule: ``re:`` patterns use :func:`re.match`, others are exact."""
    if target.startswith("re:"):
        return re.match(target.removeprefix("re:"), name) is not None
    return target == name


def shard_names(prefix: str, fused: Mapping[str, Sequence[str]] = DEFAULT_FUSED) -> list[str]:
    """The checkpoint module names behind one vLLM module name (itself when not fused)."""
    for fused_suffix, shards in fused.items():
        if prefix.endswith(fused_suffix):
            stem = prefix.removesuffix(fused_suffix)
            return [stem + shard for shard in shards]
    return [prefix]


def ignored_module(
    prefix: str, ignore: Iterable[str], fused: Mapping[str, Sequence[str]] = DEFAULT_FUSED
) -> bool | None:
    """Whether the checkpoint keeps this module unquantized; None when the shards of a fused
    module disagree (vLLM refuses such a checkpoint)."""
    patterns = list(ignore)
    hits = [any(match_name(s, p) for p in patterns) for s in shard_names(prefix, fused)]
    if all(hits):
        return True
    if any(hits):
        return None
    return False


def matching_group(
    raw: Mapping[str, Any],
    prefix: str,
    is_linear: bool,
    fused: Mapping[str, Sequence[str]] = DEFAULT_FUSED,
) -> tuple[str, Mapping[str, Any]] | None:
    """The first config group whose targets cover this module (every shard of a fused one)."""
    groups = raw.get("config_groups") or {}
    shards = shard_names(prefix, fused)
    for name, group in groups.items():
        targets = list(group.get("targets") or ())
        if is_linear and "Linear" in targets:
            return name, group
        if all(any(match_name(s, t) for t in targets) for s in shards):
            return name, group
    return None
