"""``volta_core.kernel_api.CudaBuilds``: the one rule for when a plugin's CUDA build runs.

A build loads once per (device, options); a missing toolkit or a compile error leaves the
plugin's Triton path to serve, logged once per kernel, or raises under ``VLLM_VOLTA_STRICT=1``;
a build first asked for during CUDA-graph capture is never loaded there. The loader is the
class's own seam, replaced here to succeed or to fail as a machine without NVRTC would.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

# The kernel-side API runs on torch (the core's `kernels` extra); the core's own light run skips.
torch = pytest.importorskip("torch")

from volta_core.kernel_api import (  # noqa: E402
    CudaBuilds,
    CudaCompileError,
    CudaToolkitUnavailable,
)

CUDA0 = torch.device("cuda", 0)
WHAT = "plugin_x: the tensor-core thing"
FAILURES = [
    CudaToolkitUnavailable("cuda-bindings is not installed"),
    CudaCompileError("thing", "sm_70", "thing.cu(3): error: bad"),
]


class Loads:
    """A loader recording each call; it answers a fresh object or raises ``failure``."""

    def __init__(self, failure: Exception | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.failure = failure

    def __call__(self, source: str, kernel: str, **kwargs: Any) -> object:
        self.calls.append({"source": source, "kernel": kernel, **kwargs})
        if self.failure is not None:
            raise self.failure
        return object()


@pytest.fixture(autouse=True)
def no_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.delenv("VLLM_VOLTA_STRICT", raising=False)


def test_each_build_loads_once_per_device_and_options() -> None:
    loads = Loads()
    builds = CudaBuilds(WHAT, "src", "thing", loader=loads)
    for _ in range(3):
        assert builds.ready(CUDA0, ["-DA=1"])
        assert builds.ready(CUDA0, ("-DA=2",))
        assert builds.ready(torch.device("cuda", 1), ["-DA=1"])
    assert [(c["options"], c["device"].index) for c in loads.calls] == [
        (("-DA=1",), 0),
        (("-DA=2",), 0),
        (("-DA=1",), 1),
    ]
    assert all(c["source"] == "src" and c["kernel"] == "thing" for c in loads.calls)
    assert builds.loaded(CUDA0, ["-DA=2"]) is not None
    assert builds.loaded(CUDA0, ["-DA=3"]) is None


@pytest.mark.parametrize("failure", FAILURES, ids=lambda e: type(e).__name__)
def test_without_a_build_the_fallback_serves_logged_once(
    failure: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    loads = Loads(failure)
    builds = CudaBuilds(WHAT, "src", "thing", loader=loads)
    with caplog.at_level(logging.WARNING, logger="volta_core.kernel_api"):
        assert not builds.ready(CUDA0, ["-DA=1"])
        assert not builds.ready(CUDA0, ["-DA=1"])
        assert not builds.ready(CUDA0, ["-DA=2"])
    assert len(loads.calls) == 2  # a failed build is not tried again
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning == f"{WHAT} cannot run ({failure}); Triton serves"


@pytest.mark.parametrize("failure", FAILURES, ids=lambda e: type(e).__name__)
def test_strict_mode_raises_the_failure(failure: Exception, monkeypatch: Any) -> None:
    monkeypatch.setenv("VLLM_VOLTA_STRICT", "1")
    builds = CudaBuilds(WHAT, "src", "thing", loader=Loads(failure))
    with pytest.raises(type(failure)):
        builds.ready(CUDA0, ["-DA=1"])


def test_nothing_loads_during_capture(monkeypatch: Any, caplog: pytest.LogCaptureFixture) -> None:
    loads = Loads()
    builds = CudaBuilds(WHAT, "src", "thing", loader=loads)
    assert builds.ready(CUDA0, ["-DA=1"])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert builds.ready(CUDA0, ["-DA=1"])  # loaded before capture: runs
    with caplog.at_level(logging.WARNING, logger="volta_core.kernel_api"):
        assert not builds.ready(CUDA0, ["-DA=2"])
    assert len(loads.calls) == 1
    assert "-DA=2 was first asked for during CUDA-graph capture" in caplog.text
    monkeypatch.setenv("VLLM_VOLTA_STRICT", "1")
    with pytest.raises(RuntimeError, match=f"{WHAT} cannot run: its build -DA=3"):
        builds.ready(CUDA0, ["-DA=3"])


def test_load_by_name_raises_and_keeps_the_ptx_build_apart() -> None:
    loads = Loads()
    builds = CudaBuilds(WHAT, "src", "thing", loader=loads)
    ptx = builds.load(CUDA0, ["-DA=1"], "compute_70")
    assert loads.calls[-1]["ptx_arch"] == "compute_70"
    assert builds.loaded(CUDA0, ["-DA=1"], "compute_70") is ptx
    assert builds.loaded(CUDA0, ["-DA=1"]) is None
    failing = CudaBuilds(WHAT, "src", "thing", loader=Loads(FAILURES[0]))
    with pytest.raises(CudaToolkitUnavailable):
        failing.load(CUDA0, ["-DA=1"])
