"""Child process: one graph through ncnn at several input lengths (one load).

    python tools/zoo/lengths_child.py SPEC.json   (writes SPEC.result.npz / SPEC.error.txt)

SPEC: param, bin, feeds ([blob, batch index] per input), lengths, output blob + batch
index, inputs npz (`<input index>@T`). Writes the outputs as `out@T`.
A crash kills only this process (the caller reports it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def main(spec_path: Path) -> int:
    from paramsurgery.core.npz import save_arrays
    from paramsurgery.runtime.child import Feed, Fetch, NcnnRunError, RunOptions, load_net, run_net

    spec = json.loads(spec_path.read_text())
    err_path = spec_path.with_suffix(".error.txt")
    try:
        net = load_net(spec["param"], spec["bin"], RunOptions())
    except NcnnRunError as exc:
        err_path.write_text(f"ncnn {exc.status}: {exc.message}")
        return 0
    outs: dict[str, np.ndarray] = {}
    with np.load(spec["inputs"]) as z:
        for n in spec["lengths"]:
            feeds = {blob: Feed(z[f"{i}@{n}"], bidx) for i, (blob, bidx) in enumerate(spec["feeds"])}
            try:
                res = run_net(net, feeds, [Fetch(spec["output"], spec["output_batch"])])
            except NcnnRunError as exc:
                err_path.write_text(f"T={n}: ncnn {exc.status}: {exc.message}")
                break
            outs[f"out@{n}"] = next(iter(res.values()))
    save_arrays(spec_path.with_suffix(".result.npz"), outs)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
