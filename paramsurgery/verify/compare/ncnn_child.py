"""The child side of a streamed ncnn run: `python -m paramsurgery.verify.compare.ncnn_child DIR`.

Reads `DIR/spec.json` and `DIR/inputs.npz`, loads the net with the given Option settings,
feeds the inputs and extracts the listed blobs one by one in graph order, writing each as
a frame (`paramsurgery.verify.compare.frames`) to stdout or to a file, flushed as it goes: the
parent compares each blob as it arrives, and a crash inside ncnn leaves every blob before
it readable. The last frame is `{"end": true}`; a load failure is `{"fatal": ...}`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import IO

import numpy as np

from paramsurgery.runtime.child import Feed, Fetch, _from_mat, _to_mat
from paramsurgery.verify.compare.frames import write_frame


def _load(spec: dict, out: IO[bytes]):
    import ncnn

    net = ncnn.Net()
    for key, value in spec["options"].items():
        if hasattr(net.opt, key):
            setattr(net.opt, key, value)
    # weights load in light mode whatever the setting (off, a layer keeps its weights twice:
    # as read and as repacked); the setting then applies to the extractor, as in load_net
    light = net.opt.lightmode
    net.opt.lightmode = True
    if net.load_param(spec["param"]) != 0:
        write_frame(out, {"fatal": "load_param_failed", "message": "ncnn load_param failed"})
        return None
    ret = net.load_model(ncnn.DataReaderFromEmpty()) if spec["bin"] is None \
        else net.load_model(spec["bin"])
    if ret != 0:
        write_frame(out, {"fatal": "load_model_failed", "message": f"load_model returned {ret}"})
        return None
    net.opt.lightmode = light
    return net


def stream(spec: dict, inputs: dict[str, Feed], out: IO[bytes]) -> None:
    net = _load(spec, out)
    if net is None:
        return
    with net.create_extractor() as ex:
        ex.set_light_mode(False)
        mats = {}
        for name, feed in inputs.items():
            mats[name] = _to_mat(feed)
            ret = ex.input(name, mats[name])
            if ret != 0:
                write_frame(out, {"fatal": "input_failed", "message": f"input {name!r}: {ret}"})
                return
        for name, typ in spec["blobs"]:
            # announce first: if ncnn dies inside this extract, the parent knows where
            write_frame(out, {"computing": name})
            out.flush()
            ret, mat = ex.extract(name, typ)
            if ret != 0:
                write_frame(out, {"name": name, "error": f"extract returned {ret}"})
                continue
            arr = _from_mat(mat, Fetch(name, type=typ))
            write_frame(out, {"name": name, "ncnn_dims": int(mat.dims), "n": int(getattr(mat, "n", 1))},
                        arr)
            out.flush()
    write_frame(out, {"end": True})
    out.flush()


def main(argv: list[str]) -> int:
    work = Path(argv[1])
    spec = json.loads((work / "spec.json").read_text())
    with np.load(work / "inputs.npz") as data:
        inputs = {name: Feed(data[f"i{i}"], bidx) for i, (name, bidx) in enumerate(spec["inputs"])}
    if spec.get("out"):
        with open(spec["out"], "wb") as fh:
            stream(spec, inputs, fh)
    else:
        stream(spec, inputs, sys.stdout.buffer)
    return 0


if __name__ == "__main__":  # pragma: no cover - run by paramsurgery.verify.compare.ncnn_run
    sys.exit(main(sys.argv))
