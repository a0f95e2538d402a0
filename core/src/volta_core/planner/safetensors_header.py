"""Tensor names, dtypes, shapes and sizes read from safetensors headers; no tensor is loaded.

The format (https://github.com/huggingface/safetensors): a file starts with an 8-byte
little-endian unsigned integer N, then N bytes of UTF-8 JSON mapping each tensor name to
``{"dtype": "F16", "shape": [...], "data_offsets": [begin, end]}`` (plus an optional
``"__metadata__"`` of strings); the tensor bytes follow. A tensor's size is ``end - begin``
bytes, which for the fixed-width dtypes equals the product of the shape times the element size
(checked). A sharded checkpoint names its files in ``model.safetensors.index.json``
(``"weight_map"``: tensor name -> file name). No ``safetensors`` package is needed.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from volta_core.errors import UsageError
from volta_core.planner.model_files import (
    MAX_INDEX_BYTES,
    confined,
    loads,
    open_regular,
    read_json,
)

#: The format's own limit on the header's size (the reference implementation refuses more).
MAX_HEADER_BYTES = 100_000_000
INDEX_NAME = "model.safetensors.index.json"

#: Bytes per element of the fixed-width dtypes; others (sub-byte fp4/fp6) are sized by offsets.
DTYPE_BYTES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as its header describes it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: str


def read_header(path: Path) -> list[TensorEntry]:
    """The tensors of one ``.safetensors`` file, from its header only.

    Raises :class:`UsageError` (one line naming the file) for a file too short to hold the
    length, a header longer than the file or than the format allows, bytes that are not a JSON
    object, or an entry whose dtype, shape or offsets are malformed or disagree.
    """
    with open_regular(path) as handle:
        try:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(8)
            if len(head) < 8:
                raise UsageError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (length,) = struct.unpack("<Q", head)
            # The length is the file's own first bytes: it is judged, never printed.
            if length > MAX_HEADER_BYTES or length > size - 8:
                limit = "the format's limit" if length > MAX_HEADER_BYTES else "the file"
                raise UsageError(f"{path}: not a safetensors file (header length past {limit})")
            text = handle.read(length)
        except OSError as exc:
            raise UsageError(f"{path}: cannot read: {exc.strerror}") from exc
    header = loads(text, f"{path}: safetensors header")
    if not isinstance(header, dict):
        raise UsageError(f"{path}: safetensors header is not a JSON object")
    data_bytes = size - 8 - length
    return [
        _entry(path, name, info, data_bytes)
        for name, info in header.items()
        if name != "__metadata__"
    ]


def _entry(path: Path, name: str, info: object, data_bytes: int) -> TensorEntry:
    where = f"{path}: tensor {name[:80]!r}"
    if not isinstance(info, dict):
        raise UsageError(f"{where}: entry is not a JSON object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str):
        raise UsageError(f"{where}: dtype is not a string")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise UsageError(f"{where}: shape is not a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        raise UsageError(f"{where}: data_offsets are not [begin, end] within the file")
    nbytes = offsets[1] - offsets[0]
    itemsize = DTYPE_BYTES.get(dtype)
    if itemsize is not None and nbytes != math.prod(shape) * itemsize:
        raise UsageError(
            f"{where}: {nbytes} bytes do not hold a {dtype} tensor of shape {list(shape)}"
        )
    return TensorEntry(name, dtype, tuple(shape), nbytes, path.name)


def checkpoint_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory (its index's, else every one there).

    Raises :class:`UsageError` for an index that is not JSON with a ``weight_map`` of strings
    (read under :data:`~volta_core.planner.model_files.MAX_INDEX_BYTES`), or that names a file
    the directory lacks or one resolving outside it (:func:`.model_files.confined`).
    """
    index = directory / INDEX_NAME
    if index.is_file():
        data = read_json(index, MAX_INDEX_BYTES)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()
        ):
            raise UsageError(f"{index}: has no weight_map of tensor name -> file name")
        files = []
        for name in sorted(set(weight_map.values())):
            file = confined(directory, name, str(index))
            if not file.is_file():
                raise UsageError(f"{index}: names {name[:80]!r}, which the directory does not hold")
            files.append(file)
        return files
    found = sorted(p for p in directory.glob("*.safetensors") if p.is_file())
    return [confined(directory, p.name, str(directory)) for p in found]


def checkpoint_tensors(directory: Path) -> list[TensorEntry]:
    """Every tensor of the checkpoint in ``directory`` (empty when it has no safetensors)."""
    return [entry for file in checkpoint_files(directory) for entry in read_header(file)]
