"""Child process: a greedy decode through ncnn with SDPA's native kv caches.

    python tools/zoo/decode_child.py SPEC.json   (writes SPEC.result.json)

SPEC: param, bin, input blob (token embeddings, T × hidden; the ids, int32, when
`input_ids`), output blob (logits,
T × vocab), embed table (.npy), prompt ids, steps, cache slots [k_in, v_in, k_out, v_out],
and for the kv form the mask and positions blobs with their rank as ncnn sees them (the
traced rank without pnnx's batch axis): the mask is the causal additive (T, past + T)
block with leading axes of 1, the positions past..past+T-1.
The prompt is one prefill call with empty caches; each step feeds the embedding of the
previous argmax and the caches ncnn returned (`extract(name, 1)`: SDPA's cache layout is
backend-private). Result: the tokens and the last row of logits of every call, or
{"error": ...}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def main(spec_path: Path) -> int:
    import ncnn

    from paramsurgery.runtime.child import NcnnRunError, RunOptions, load_net

    spec = json.loads(spec_path.read_text())
    out_path = spec_path.with_suffix(".result.json")
    embed = np.load(spec["embed"])
    try:
        net = load_net(spec["param"], spec["bin"], RunOptions())
    except NcnnRunError as exc:
        out_path.write_text(json.dumps({"error": f"load: {exc.message}"}))
        return 0
    keep: list = []

    def call(ids: list[int], caches: dict) -> tuple[np.ndarray, dict]:
        ex = net.create_extractor()
        # the ids route's input is read by an Embed: int32 ids; else the token embeddings
        x = np.array(ids, np.int32) if spec.get("input_ids") else \
            np.ascontiguousarray(embed[np.array(ids)], np.float32)
        keep.append(x)
        feeds = {spec["input"]: x}
        past = caches.get("_past", 0)
        t = len(ids)
        for blob, (kind, rank) in spec.get("extra", {}).items():
            if kind == "mask":
                m = np.zeros((t, past + t), np.float32)
                m[:, past:][np.triu_indices(t, 1)] = np.finfo(np.float32).min
                feeds[blob] = m.reshape((1,) * (rank - 2) + m.shape)
            else:
                # int32 only for an Embed's ids (learned positions); else float32 values
                dtype = np.int32 if kind == "position_ids" else np.float32
                feeds[blob] = np.arange(past, past + t, dtype=dtype).reshape(
                    (1,) * (rank - 1) + (t,))
        for blob, arr in feeds.items():
            keep.append(arr)
            if ex.input(blob, ncnn.Mat(np.ascontiguousarray(arr)).clone()) != 0:
                raise RuntimeError(f"input {blob} rejected")
        for k_in, v_in, _, _ in spec["slots"]:
            ex.input(k_in, caches.get(k_in, ncnn.Mat()))  # empty Mats: no past yet
            ex.input(v_in, caches.get(v_in, ncnn.Mat()))
        ret, out = ex.extract(spec["output"])
        if ret != 0:
            raise RuntimeError(f"extract {spec['output']} returned {ret}")
        logits = np.array(out, copy=True)
        if logits.size % len(ids):
            raise RuntimeError(f"output {spec['output']} has shape {logits.shape} for "
                               f"{len(ids)} token(s)")
        logits = logits.reshape(len(ids), -1)
        new: dict = {"_past": past + t}
        for k_in, v_in, k_out, v_out in spec["slots"]:
            for src, dst in ((k_out, k_in), (v_out, v_in)):
                r, c = ex.extract(src, 1)
                if r != 0:
                    raise RuntimeError(f"extract {src} returned {r}")
                new[dst] = c
        return logits[-1], new

    try:
        last, caches = call(list(spec["prompt"]), {})
        rows = [last]
        tokens: list[int] = []
        for _ in range(spec["steps"]):
            tokens.append(int(np.argmax(rows[-1])))
            last, caches = call([tokens[-1]], caches)
            rows.append(last)
        result = {"tokens": tokens, "logits": np.stack(rows).tolist()}
    except (RuntimeError, NcnnRunError, ValueError, IndexError) as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    out_path.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
