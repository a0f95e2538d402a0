"""Reading the files of a model directory nobody vouched for: bounded, confined, never echoed.

``vllm-volta plan`` and ``doctor --model`` read a directory a user downloaded. The rules:

- Only regular files are read, opened without blocking (a FIFO named ``config.json`` would block
  a plain ``open`` forever) and checked on the open descriptor.
- JSON files are read up to a cap (:data:`MAX_CONFIG_BYTES`, :data:`MAX_INDEX_BYTES`), never
  whole: a larger file is refused unread.
- JSON integers longer than :data:`MAX_INT_DIGITS` digits are refused while parsing (no model
  field is that large, and Python refuses to convert 4300 digits and more anyway), as is
  nesting deeper than the parser's recursion allows: each a :class:`UsageError`.
- A file a directory names (a shard in the index, ``config.json``) must resolve, symbolic links
  followed, inside the directory, or inside the ``blobs`` folder of the Hugging Face cache
  repository whose snapshot the directory is (the hub cache keeps each file there and links it
  from ``snapshots/<revision>/``; huggingface_hub's "Manage the cache" guide).
- Error messages name paths and what is wrong, never the bytes a file holds.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from volta_core.errors import UsageError

#: Largest ``config.json`` read (real ones are a few kilobytes).
MAX_CONFIG_BYTES = 4 * 2**20
#: Largest ``model.safetensors.index.json`` read (a 100k-tensor MoE index is about 10 MiB).
MAX_INDEX_BYTES = 64 * 2**20
#: Most digits of a JSON integer: 2**53, the largest integer every JSON reader keeps exactly
#: (RFC 8259, section 6), has 16.
MAX_INT_DIGITS = 16


class _TooManyDigits(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _TooManyDigits(len(text.lstrip("-")))
    return int(text)


def loads(text: str | bytes, where: str) -> Any:
    """Parse JSON text from an untrusted file; :class:`UsageError` naming ``where`` if bad."""
    try:
        return json.loads(text, parse_int=_parse_int)
    except _TooManyDigits as exc:
        raise UsageError(
            f"{where}: a JSON integer of {exc.args[0]} digits (more than {MAX_INT_DIGITS}: "
            "no model field is that large)"
        ) from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise UsageError(f"{where}: JSON nested too deeply") from None


def open_regular(path: Path, shown: str | None = None) -> BinaryIO:
    """Open ``path`` for reading if it is a regular file (links followed); never blocks.

    :raises UsageError: missing, unreadable, a link loop, or not a regular file.
    """
    shown = str(path) if shown is None else shown
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(f"{shown}: symbolic link loop") from None
        raise UsageError(f"{shown}: cannot read: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{shown}: not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_capped(path: Path, limit: int, shown: str | None = None) -> bytes:
    """The bytes of regular file ``path``, refused unread beyond ``limit`` bytes."""
    shown = str(path) if shown is None else shown
    with open_regular(path, shown) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise UsageError(f"{shown}: cannot read: {exc.strerror}") from None
    if len(data) > limit:
        raise UsageError(f"{shown}: larger than {limit // 2**20} MiB, the most read of this file")
    return data


def read_json(path: Path, limit: int, shown: str | None = None) -> Any:
    """A JSON file read under ``limit`` bytes and parsed by :func:`loads`."""
    shown = str(path) if shown is None else shown
    return loads(read_capped(path, limit, shown), shown)


def allowed_roots(directory: Path) -> tuple[Path, ...]:
    """Where files of the model ``directory`` may resolve: the directory itself, and for a
    Hugging Face cache snapshot (``.../snapshots/<revision>``) its repository's ``blobs``."""
    root = directory.resolve()
    roots = [root]
    if root.parent.name == "snapshots":
        roots.append(root.parent.parent / "blobs")
    return tuple(roots)


def confined(directory: Path, name: str, what: str) -> Path:
    """``directory / name`` resolved (links followed), refused unless it stays inside
    :func:`allowed_roots`; ``what`` names who named it, for the message."""
    if not name or "\0" in name:
        raise UsageError(f"{what}: names {name[:80]!r}, not a file name")
    try:
        resolved = (directory / name).resolve()
    except (OSError, RuntimeError):
        raise UsageError(f"{what}: names {name[:80]!r}, which does not resolve") from None
    if not any(resolved.is_relative_to(root) for root in allowed_roots(directory)):
        raise UsageError(f"{what}: names {name[:80]!r}, which resolves outside the model directory")
    return resolved
