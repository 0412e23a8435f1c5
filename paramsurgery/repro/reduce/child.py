"""The harvest child: `python -m paramsurgery.repro.reduce --harvest-child DIR` loads the
graph, extracts every blob in file order and saves each one as it goes (a crash keeps
everything computed before it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from paramsurgery.runtime.child import NO_BATCH, Feed




def _harvest_child(d: Path) -> int:
    from paramsurgery.runtime.child import NcnnRunError, RunOptions, _to_mat, load_net

    spec = json.loads((d / "spec.json").read_text())
    try:
        net = load_net(spec["param"], spec["bin"], RunOptions(light_mode=False))
    except NcnnRunError as exc:
        (d / "load_failed.txt").write_text(f"{exc.status}: {exc.message}")
        return 0
    with np.load(d / "inputs.npz") as z:
        keys = set(z.files)
        mats = {}
        for name in spec["inputs"]:
            bi = int(z[f"batch_index_{name}"]) if f"batch_index_{name}" in keys else NO_BATCH
            mats[name] = _to_mat(Feed(z[name], bi))
    ex = net.create_extractor()
    ex.set_light_mode(False)
    for name, mat in mats.items():
        ex.input(name, mat)
    with open(d / "index.tsv", "w") as index, open(d / "current.txt", "w") as cur:
        for i, blob in enumerate(spec["blobs"]):
            cur.seek(0)
            cur.write(blob + "\n")
            cur.truncate()
            cur.flush()
            ret, mat = ex.extract(blob)
            if ret != 0 or mat.dims == 0:
                continue
            if getattr(mat, "n", 1) > 1:
                arr, bi = np.array(mat.numpy(batch_index=0), copy=True), 0
            else:
                arr, bi = np.array(mat, copy=True), NO_BATCH
            np.save(d / f"{i}.npy", arr)
            index.write(f"{i}\t{blob}\t{bi}\n")
            index.flush()
    return 0


def main(argv: list[str]) -> int:  # pragma: no cover - child entry point
    if len(argv) == 2 and argv[0] == "--harvest-child":
        return _harvest_child(Path(argv[1]))
    print("usage: python -m paramsurgery.repro.reduce --harvest-child DIR (internal)",
          file=sys.stderr)
    return 2

