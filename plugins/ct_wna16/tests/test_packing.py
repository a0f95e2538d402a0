"""The packing the kernels read is compressed-tensors' own, checked against the library."""

from __future__ import annotations

import pytest
import torch
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from ct_wna16_checkpoints import fresh_checkpoint, library_checkpoint

from volta_ct_wna16.layout import pack_int32, unpack_int32
from volta_ct_wna16.scheme import WeightScheme


def test_facts_test_vector() -> None:
    values = torch.arange(-8, 0, dtype=torch.int8).reshape(1, 8)
    assert int(pack_to_int32(values, 4)[0, 0]) == 0x76543210
    assert int(pack_int32(values, 4, dim=1)[0, 0]) == 0x76543210
    assert unpack_int32(torch.tensor([[0x76543210]], dtype=torch.int32), 4, 8, 1).tolist() == [
        list(range(8))
    ]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("shape", [(16, 64), (13, 37), (40, 10)])
def test_pack_matches_the_library_and_unpacks(bits, dim, shape) -> None:
    gen = torch.Generator().manual_seed(sum(shape) + bits + dim)
    lo, hi = -(1 << (bits - 1)), 1 << (bits - 1)
    values = torch.randint(lo, hi, shape, generator=gen, dtype=torch.int8)
    ours = pack_int32(values, bits, dim=dim)
    theirs = pack_to_int32(values, bits, packed_dim=dim)
    assert ours.dtype == torch.int32
    assert torch.equal(ours, theirs)
    back = unpack_int32(ours, bits, shape[dim], dim=dim)
    assert torch.equal(back, values.to(torch.int32) + hi)


@pytest.mark.parametrize(
    "scheme",
    [WeightScheme(b, s, g) for b in (4, 8) for s in (True, False) for g in (32, 64, 128, None)],
    ids=lambda s: s.label.replace(" ", "-"),
)
def test_fresh_checkpoints_equal_the_library_ones(scheme) -> None:
    # The GPU machine has no compressed-tensors: its fresh data must be exactly the library's.
    ours = fresh_checkpoint(24, 256, scheme, seed=11)
    theirs = library_checkpoint(24, 256, scheme, seed=11)
    assert ours.tensors.keys() == theirs.tensors.keys()
    for name, tensor in theirs.tensors.items():
        assert torch.equal(ours.tensors[name], tensor), name
