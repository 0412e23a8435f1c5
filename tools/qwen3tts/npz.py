"""Byte-reproducible `.npz` files.

`numpy.savez` stamps every zip member with the current time, so regenerating identical
arrays changes the file (and its sha256 in the manifest). This writer uses a fixed
timestamp, sorted member names and no compression; `numpy.load` reads the result as usual.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Mapping

import numpy as np

_EPOCH = (1980, 1, 1, 0, 0, 0)


def save_npz(path: str | Path, arrays: Mapping[str, np.ndarray]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())
    tmp.replace(path)
