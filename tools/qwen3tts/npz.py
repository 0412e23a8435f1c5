"""Byte-reproducible `.npz` files: the package's writer (fixed timestamps, sorted members),
creating the directory first."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from paramsurgery.core.npz import write_npz


def save_npz(path: str | Path, arrays: Mapping[str, np.ndarray]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_npz(path, arrays)
