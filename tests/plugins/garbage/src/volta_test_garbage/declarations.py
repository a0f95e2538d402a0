"""A plugin whose declaration hook answers a string instead of a list of backends.

The host must refuse it at registration (recorded as failed, naming the hook) and keep every
other plugin; before the boundary checks, reading ``.name`` of each character crashed the host.
"""

from __future__ import annotations

from volta_core import hookimpl

VOLTA_HOST_API = "1.0"


@hookimpl
def volta_attention_backends() -> object:
    return "TEST_GARBAGE_ATTN"
