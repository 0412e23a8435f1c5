"""A greedy decode through ncnn with SDPA's native kv caches, for comparison with torch's own
cached decode (HF's `DynamicCache`).

The graph is a decoder after `add-kvcache`: token embeddings in (T × hidden), logits out
(T × vocab); optional extra inputs by role: `mask` (the additive causal block (T, past + T),
HF's `finfo.min` above the diagonal, with leading axes of 1 up to its rank) and `positions`
(past .. past + T - 1 as float32 values: the contract `lower` states when it removes HF's
`position_ids.float()` cast; `position_ids`: the same as int32 ids where an Embed reads
them, GPT-2's learned table). The prompt is one prefill call with empty caches; every step
feeds the embedding of the previous argmax and the caches ncnn returned (`extract(name, 1)`:
SDPA's cache layout is backend-private). The loop runs in a child process.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from paramsurgery.core.errors import VerificationError
from paramsurgery.formats.io import load


@dataclass
class Decode:
    """The tokens a greedy decode produced and the last row of logits of every call."""

    tokens: list[int]
    logits: np.ndarray
    error: str | None = None
    calls: int = 0
    notes: list[str] = field(default_factory=list)


def greedy_decode(param: str | Path, bin: str | Path | None, *, embed: np.ndarray,
                  prompt: Sequence[int], steps: int, embeds: str = "in0",
                  output: str = "out0", extra: Mapping[str, tuple[str, int]] | None = None,
                  timeout: float = 600) -> Decode:
    """`extra`: blob -> (role "mask" | "positions" | "position_ids", its rank as ncnn sees
    it); "position_ids" feeds the positions as int32 ids (an input an Embed reads)."""
    roles = {"mask", "positions", "position_ids"}
    bad = [f"{b}: {r!r}" for b, (r, _) in (extra or {}).items() if r not in roles]
    if bad:
        raise VerificationError(f"unknown input role(s) {', '.join(bad)} (choose from "
                                f"{', '.join(sorted(roles))})")
    from paramsurgery.passes.kvcache import cache_slots
    from paramsurgery.runtime.child import run_module_child

    g = load(param)
    slots = cache_slots(g)
    if not slots:
        raise VerificationError("the graph has no attention layer with a kv cache (7=1); run "
                                "add-kvcache first", file=str(param))
    for blob in [embeds, *(extra or {})]:
        if blob not in g.inputs:
            raise VerificationError(f"{blob!r} is not a graph input (inputs: "
                                    f"{', '.join(g.inputs)})", file=str(param))
    with tempfile.TemporaryDirectory(prefix="paramsurgery-decode-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        np.save(Path(tmp) / "embed.npy", np.ascontiguousarray(embed, np.float32))
        spec_path.write_text(json.dumps({
            "param": str(param), "bin": None if bin is None else str(bin),
            "embed": str(Path(tmp) / "embed.npy"), "prompt": [int(t) for t in prompt],
            "steps": steps, "input": embeds, "output": output,
            "extra": {b: list(v) for b, v in (extra or {}).items()},
            "slots": [[s.k_in, s.v_in, s.k_out, s.v_out] for s in slots]}))
        out_path = spec_path.with_suffix(".result.json")
        error = run_module_child("paramsurgery.verify.decode", spec_path, out_path, timeout)
        if error:
            return Decode([], np.zeros((0, 0), np.float32), error=error)
        data = json.loads(out_path.read_text())
    if data.get("error"):
        return Decode([], np.zeros((0, 0), np.float32), error=data["error"])
    return Decode(data["tokens"], np.asarray(data["logits"], np.float32), calls=data["calls"])


def _child(spec_path: Path) -> int:
    import ncnn

    from paramsurgery.runtime.child import NcnnRunError, RunOptions, load_net, write_child_result

    spec = json.loads(spec_path.read_text())
    out_path = spec_path.with_suffix(".result.json")
    embed = np.load(spec["embed"])
    try:
        net = load_net(spec["param"], spec["bin"], RunOptions())
    except NcnnRunError as exc:
        out_path.write_text(json.dumps({"error": f"load: {exc.message}"}))
        return 0
    keep: list = []  # the arrays behind the Mats live until the call ends

    def feed(ex, blob: str, arr: np.ndarray, dtype=np.float32) -> None:
        arr = np.ascontiguousarray(arr, dtype)
        keep.append(arr)
        if ex.input(blob, ncnn.Mat(arr).clone()) != 0:
            raise RuntimeError(f"input {blob} rejected")

    def call(ids: list[int], past: int, caches: dict) -> tuple[np.ndarray, dict]:
        ex = net.create_extractor()
        t = len(ids)
        feed(ex, spec["input"], embed[np.array(ids)])
        for blob, (role, rank) in spec["extra"].items():
            if role == "mask":
                m = np.zeros((t, past + t), np.float32)
                m[:, past:][np.triu_indices(t, 1)] = np.finfo(np.float32).min
                feed(ex, blob, m.reshape((1,) * (rank - 2) + m.shape))
            else:  # an Embed reads int32 ids (GPT-2's learned position table)
                feed(ex, blob, np.arange(past, past + t).reshape((1,) * (rank - 1) + (t,)),
                     np.int32 if role == "position_ids" else np.float32)
        for k_in, v_in, _, _ in spec["slots"]:
            ex.input(k_in, caches.get(k_in, ncnn.Mat()))  # empty Mats: no past yet
            ex.input(v_in, caches.get(v_in, ncnn.Mat()))
        ret, out = ex.extract(spec["output"])
        if ret != 0:
            raise RuntimeError(f"extract {spec['output']} returned {ret}")
        logits = np.array(out, copy=True).reshape(t, -1)
        new: dict = {}
        for k_in, v_in, k_out, v_out in spec["slots"]:
            for src, dst in ((k_out, k_in), (v_out, v_in)):
                r, c = ex.extract(src, 1)
                if r != 0:
                    raise RuntimeError(f"extract {src} returned {r}")
                new[dst] = c
        return logits[-1], new

    def decode() -> dict:
        prompt = list(spec["prompt"])
        last, caches = call(prompt, 0, {})
        rows, tokens, past = [last], [], len(prompt)
        for _ in range(spec["steps"]):
            tokens.append(int(np.argmax(rows[-1])))
            if len(tokens) == spec["steps"]:
                break
            last, caches = call([tokens[-1]], past, caches)
            past += 1
            rows.append(last)
        return {"tokens": tokens, "logits": np.stack(rows).tolist(), "calls": len(rows)}

    return write_child_result(out_path, decode)


if __name__ == "__main__":  # pragma: no cover - run by greedy_decode
    sys.exit(_child(Path(sys.argv[1])))
