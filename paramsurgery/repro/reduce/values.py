"""Blob values for a reduction: the store (npz in and out) and the harvest of every
blob's value from one run of a graph in a child process (`child.py`)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from paramsurgery.core.npz import save_arrays

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.runtime.child import NO_BATCH, Feed
from paramsurgery.runtime.launch import module_argv, run_child


FAIL, PASS, OTHER, UNKNOWN = "fail", "pass", "other", "unknown"
KINDS = ("crash", "load-error", "mismatch", "any")


# =========================================================================== values

def _ncnn_shape(arr: np.ndarray, batch_index: int) -> tuple[int, ...]:
    shape = list(arr.shape)
    if batch_index != NO_BATCH and 0 <= batch_index < len(shape):
        del shape[batch_index]
    return tuple(shape)


class ValueStore:
    """Known blob values: blob -> (array, batch_index)."""

    def __init__(self) -> None:
        self.values: dict[str, tuple[np.ndarray, int]] = {}

    def __contains__(self, blob: str) -> bool:
        return blob in self.values

    def __len__(self) -> int:
        return len(self.values)

    def get(self, blob: str) -> tuple[np.ndarray, int] | None:
        return self.values.get(blob)

    def put(self, blob: str, arr: np.ndarray, batch_index: int = NO_BATCH) -> None:
        self.values[blob] = (arr, batch_index)

    def feed(self, blob: str) -> Feed | None:
        v = self.values.get(blob)
        return None if v is None else Feed(v[0], v[1])

    def input_params(self, blob: str) -> dict[int, int] | None:
        """ncnn `Input` params (0=w 1=h 11=d 2=c) for a blob of known shape."""
        v = self.values.get(blob)
        if v is None:
            return None
        shape = _ncnn_shape(*v)
        if not 1 <= len(shape) <= 4:
            return None
        keys = {1: (0,), 2: (1, 0), 3: (2, 1, 0), 4: (2, 11, 1, 0)}[len(shape)]
        return {k: int(d) for k, d in zip(keys, shape)}

    @classmethod
    def from_npz(cls, path: str | os.PathLike, names: Iterable[str] | None = None) -> "ValueStore":
        """Blob values from an npz: keys are blob names, `batch_index_<blob>` optional.
        With `names`, only those keys are taken (e.g. a ref.npz's in0 but not its out0)."""
        store = cls()
        try:
            z = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ParamSurgeryError(f"cannot read inputs: {exc}", file=os.fspath(path)) from None
        with z:
            keys = set(z.files)
            want = set(names) if names is not None else {k for k in keys
                                                          if not k.startswith("batch_index_")}
            for k in sorted(keys & want):
                bi = int(z[f"batch_index_{k}"]) if f"batch_index_{k}" in keys else NO_BATCH
                store.put(k, np.asarray(z[k]), bi)
        return store

    def save_npz(self, path: Any, blobs: Iterable[str]) -> list[str]:
        """Write the values of `blobs` (those known) in the from_npz layout to a path or a
        binary file object; returns the blobs written."""
        arrays: dict[str, np.ndarray] = {}
        done = []
        for b in blobs:
            v = self.values.get(b)
            if v is None:
                continue
            arrays[b] = v[0]
            if v[1] != NO_BATCH:
                arrays[f"batch_index_{b}"] = np.array(v[1], dtype=np.int32)
            done.append(b)
        if hasattr(path, "write"):
            save_arrays(path, arrays)
        else:
            with open(path, "wb") as fh:
                save_arrays(fh, arrays)
        return done


@dataclass
class Harvest:
    """The outcome of running a graph once and extracting every blob."""

    status: str                       # ok | crash | load_fail | error | timeout
    extracted: int = 0
    stopped_at: str | None = None     # the blob whose extraction did not come back
    signal: int | None = None
    message: str = ""
    seconds: float = 0.0


def harvest(param: str | os.PathLike, bin: str | os.PathLike | None, feeds: ValueStore,
            blobs: Sequence[str], store: ValueStore, *, timeout: float = 600.0) -> Harvest:
    """Run the graph in a child process, extract `blobs` in order (light mode off, so each
    extract computes one more layer) and put every value that came back into `store`."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="paramsurgery-harvest-") as tmp:
        d = Path(tmp)
        inputs = [b for b in feeds.values]
        feeds.save_npz(d / "inputs.npz", inputs)
        (d / "spec.json").write_text(json.dumps({
            "param": os.fspath(param), "bin": None if bin is None else os.fspath(bin),
            "inputs": inputs, "blobs": list(blobs)}))
        proc = run_child(*module_argv("paramsurgery.repro.reduce", "--harvest-child", d),
                         timeout=timeout, errors="replace")
        rc, err = proc.returncode, proc.stderr or ""
        status = "timeout" if proc.timed_out else "ok" if proc.ok else \
            "crash" if proc.signal is not None else "error"
        n = 0
        index = d / "index.tsv"
        if index.exists():
            for line in index.read_text().splitlines():
                parts = line.split("\t")
                if len(parts) != 3:
                    continue            # a line cut by the crash
                i, blob, bi = parts
                f = d / f"{i}.npy"
                if blob in store:       # keep given values (inputs) as they were fed
                    continue
                try:
                    store.put(blob, np.load(f, allow_pickle=False), int(bi))
                    n += 1
                except (OSError, ValueError):
                    pass
        stopped = None
        cur = d / "current.txt"
        if status != "ok" and cur.exists():
            stopped = cur.read_text().strip() or None
        loadf = d / "load_failed.txt"
        message = ""
        if loadf.exists():
            status = "load_fail"
            message = loadf.read_text().strip()
        elif status != "ok":
            message = "\n".join([ln for ln in err.splitlines() if ln.strip()][-5:])
    return Harvest(status, n, stopped, -rc if rc is not None and rc < 0 else None, message,
                   time.monotonic() - t0)
