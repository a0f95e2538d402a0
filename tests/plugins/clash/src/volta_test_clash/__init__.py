"""Two test-only plugins declaring the same attention backend name: neither may win.

``a_test_clash`` and ``zz_test_clash`` sort before and after every other plugin, so a rule that
depended on entry-point name order would let one of them through. The backend admits only the
fictitious capability 1.0, so no real model is affected.
"""

from __future__ import annotations

from volta_core.host.types import AttentionBackendSpec

VOLTA_HOST_API = "1.0"

SPEC = AttentionBackendSpec(
    name="TEST_CLASH_ATTN",
    impl="volta_test_clash:Backend",
    priority=-100,
    min_capability=(1, 0),
    max_capability=(1, 0),
    dtypes=frozenset({"float16"}),
    kv_cache_dtypes=frozenset({"float16"}),
    head_sizes=frozenset({8}),
)
