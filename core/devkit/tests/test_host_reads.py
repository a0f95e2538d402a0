"""The host-read trap: every way of reading a tensor's values on the host raises inside it,
except reads of the host copies it is told about and of what is computed from them alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from volta_devkit.host_reads import HostReadError, host_time_us, no_host_reads  # noqa: E402

#: Each read, on a one-element int tensor ``s`` and a vector ``v``.
READS: dict[str, Callable[[Any, Any], object]] = {
    "item": lambda s, v: s.item(),
    "tolist": lambda s, v: v.tolist(),
    "cpu": lambda s, v: v.cpu(),
    "to cpu": lambda s, v: v.to("cpu"),
    "numpy": lambda s, v: v.numpy(),
    "int": lambda s, v: int(s),
    "bool": lambda s, v: bool(s),
    "if": lambda s, v: 1 if s else 0,
    "float": lambda s, v: float(s),
    "index a list": lambda s, v: [0, 1, 2, 3][s],
    "format": lambda s, v: f"{s}",
    "nonzero": lambda s, v: v.nonzero(),
    "torch.nonzero": lambda s, v: torch.nonzero(v),
    "boolean mask": lambda s, v: v[v > 1],
    "equal": lambda s, v: torch.equal(v, v),
    "unique": lambda s, v: torch.unique(v),
}


@pytest.mark.parametrize("read", list(READS))
def test_every_read_raises_and_an_allowed_one_passes(read: str) -> None:
    s, v = torch.tensor(2), torch.tensor([0, 1, 2])
    with no_host_reads(), pytest.raises(HostReadError, match="on the host"):
        READS[read](s, v)
    with no_host_reads(allow=[s, v]):
        READS[read](s, v)


def test_what_is_computed_from_host_copies_alone_is_theirs() -> None:
    host, device = torch.tensor([0, 1, 3]), torch.tensor([1, 1])
    with no_host_reads(allow=[host]):
        assert int(host[-1]) == 3  # a view
        assert int(host.diff().max()) == 2  # computed from it alone
        mixed = host[1:] + device
        with pytest.raises(HostReadError, match=r"__bool__\(\)"):
            bool((mixed > 0).all())
        with pytest.raises(HostReadError, match=r"item\(\)"):
            torch.zeros(1).item()  # made inside: the device's


def test_device_work_and_moves_to_a_tensors_device_pass() -> None:
    x = torch.ones(4)
    with no_host_reads():
        y = (x * 2).to(x.device).reshape(2, 2).sum(0)
        z = torch.empty(3, device=x.device)
    assert y.tolist() == [4.0, 4.0]
    assert z.shape == (3,)


def test_host_time_counts_every_round_after_a_warming_one() -> None:
    """``calls`` calls a round, ``repeat`` rounds timed after one not timed; the figures are the
    thread's CPU time per call, so a call that spins for 0.2 ms of CPU reads about 200 us."""
    import time

    seen = []

    def spin() -> None:
        seen.append(None)
        end = time.thread_time_ns() + 200_000
        while time.thread_time_ns() < end:
            pass

    median, least = host_time_us(spin, calls=3, repeat=4)
    assert len(seen) == 3 * 5
    assert 200 <= least <= median < 2000
