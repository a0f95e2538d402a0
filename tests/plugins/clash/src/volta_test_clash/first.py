"""One of the two clashing plugins (see the package docstring)."""

from __future__ import annotations

from volta_core import hookimpl
from volta_core.host.types import AttentionBackendSpec
from volta_test_clash import SPEC

VOLTA_HOST_API = "1.0"


@hookimpl
def volta_attention_backends() -> list[AttentionBackendSpec]:
    return [SPEC]
