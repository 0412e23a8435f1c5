"""Byte-reproducible `.npz` files (for fixtures and references).

`numpy.savez` stamps every zip member with the current time, so regenerating identical
arrays changes the file (and any sha256 recorded for it). This writer uses a fixed
timestamp, sorted member names, fixed permissions and no compression, and writes
atomically; `numpy.load` reads the result as usual.
"""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path
from typing import IO, Any, Mapping

import numpy as np

from paramsurgery.core.fs import atomic_write

_EPOCH = (1980, 1, 1, 0, 0, 0)


def write_npz(path: str | Path, arrays: Mapping[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for key in sorted(arrays):
            member = io.BytesIO()
            # np.asarray(order="C"), not ascontiguousarray, which turns 0-d arrays into 1-d
            np.lib.format.write_array(member, np.asarray(arrays[key], order="C"),
                                      allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue())
    atomic_write(path, buf.getvalue())


def save_arrays(file: str | os.PathLike | IO[bytes], arrays: Mapping[str, np.ndarray]) -> None:
    """A scratch `.npz` (what a child process reads or writes back): numpy's own writer.
    (numpy's stub types `**arrays` as its `allow_pickle` keyword, hence the Any.)"""
    savez: Any = np.savez
    savez(file, **arrays)
