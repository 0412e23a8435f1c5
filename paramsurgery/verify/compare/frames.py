"""The blob stream format shared by the child runs and the parent: one frame per array.

A frame is a 4-byte little-endian header length, a JSON header (`name`, `dtype`, `shape`,
plus anything the writer adds) and the array's raw C-order bytes. A header without `dtype`
carries no payload (end of stream, a failure report). The same frames go through a pipe
(read once, in order, each array dropped after use) or into a scratch file that is then
memory-mapped (`FrameFile`: arrays are views into the page cache, never all in memory).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from typing import IO, Any, Iterator

import numpy as np

_LEN = struct.Struct("<I")


def write_frame(fh: IO[bytes], header: dict[str, Any], array: np.ndarray | None = None) -> None:
    """Append one frame; `array` (any dtype numpy can name) is written in C order."""
    head = dict(header)
    if array is not None:
        array = np.ascontiguousarray(array)
        head["dtype"] = array.dtype.str
        head["shape"] = list(array.shape)
    raw = json.dumps(head).encode()
    fh.write(_LEN.pack(len(raw)))
    fh.write(raw)
    if array is not None and array.size:
        # (an empty array has no payload; memoryview.cast refuses a view with a zero dim)
        fh.write(memoryview(np.ascontiguousarray(array).data).cast("B"))


def _payload_size(head: dict[str, Any]) -> int:
    if "dtype" not in head:
        return 0
    return int(np.dtype(head["dtype"]).itemsize * int(np.prod(head["shape"], dtype=np.int64)))


def _read_exact(fh: IO[bytes], n: int) -> bytes | None:
    chunks = []
    left = n
    while left:
        b = fh.read(left)
        if not b:
            return None
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def read_frames(fh: IO[bytes]) -> Iterator[tuple[dict[str, Any], np.ndarray | None]]:
    """Frames from a stream, in order; stops quietly at a truncated frame (the writer
    died: the caller learns why from the child's exit status)."""
    while True:
        raw = _read_exact(fh, _LEN.size)
        if raw is None:
            return
        (n,) = _LEN.unpack(raw)
        text = _read_exact(fh, n)
        if text is None:
            return
        head = json.loads(text)
        size = _payload_size(head)
        if size == 0 and "dtype" not in head:
            yield head, None
            continue
        data = _read_exact(fh, size) if size else b""
        if data is None:
            return
        yield head, np.frombuffer(data, dtype=np.dtype(head["dtype"])).reshape(head["shape"])


class FrameFile:
    """A scratch file of frames, memory-mapped: `get(name)` is a read-only view (pages come
    in when read and can be dropped by the kernel), `headers` the frame headers in order."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self.headers: list[dict[str, Any]] = []
        self._where: dict[str, tuple[int, dict[str, Any]]] = {}
        size = os.path.getsize(self.path)
        self._fh = open(self.path, "rb")
        self._map = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        pos = 0
        while self._map is not None and pos + _LEN.size <= size:
            (n,) = _LEN.unpack_from(self._map, pos)
            if pos + _LEN.size + n > size:
                break
            head = json.loads(self._map[pos + _LEN.size: pos + _LEN.size + n])
            start = pos + _LEN.size + n
            end = start + _payload_size(head)
            if end > size:
                break
            self.headers.append(head)
            if "dtype" in head and "name" in head:
                self._where.setdefault(head["name"], (start, head))
            pos = end

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def get(self, name: str) -> np.ndarray | None:
        hit = self._where.get(name)
        if hit is None or self._map is None:
            return None
        start, head = hit
        dtype = np.dtype(head["dtype"])
        count = int(np.prod(head["shape"], dtype=np.int64))
        if count == 0:
            return np.empty(head["shape"], dtype)
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=start).reshape(head["shape"])

    def header(self, name: str) -> dict[str, Any] | None:
        hit = self._where.get(name)
        return None if hit is None else hit[1]

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still alive: the mapping goes with it
                pass
            self._map = None
        self._fh.close()

    def __enter__(self) -> "FrameFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
