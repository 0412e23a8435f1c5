"""Run a fixture in ncnn and classify what happens (no torch needed).

Statuses (the manifest's `status.kind`):
- `runs_right`: loads, runs, every output has the reference's element count and
  max|ncnn - torch| / max|torch| <= REL_TOL;
- `wrong`: runs, but an output differs (value error above REL_TOL, or a different size);
- `load_fails`: `load_param`/`load_model` returns an error (ncnn's message kept);
- `run_fails`: loads, but `input`/`extract` returns an error;
- `crashes`: the child process dies from a signal (SIGSEGV, SIGFPE, ...);
- `loads`: only load_param was tried (real-size params without their `.bin`).

The run is always isolated in a child process (`paramsurgery.runtime.child.run_isolated`), so a
crash in ncnn is a result, not a dead generator or test session.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from paramsurgery.runtime.child import NO_BATCH, Feed, Fetch, RunOptions, run_isolated

REL_TOL = 1e-4

# ncnn's own diagnostics on stderr (the Python binding only returns -1)
_NCNN_MSG = re.compile(r"(not exists or registered|failed|invalid|too many|error|"
                       r"not supported|malformed)", re.I)


def ncnn_messages(stderr: str, limit: int = 6) -> list[str]:
    out: list[str] = []
    for line in stderr.splitlines():
        s = line.strip()
        if s and _NCNN_MSG.search(s) and s not in out:
            out.append(s)
    return out[:limit]


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64).reshape(ref.shape)
    denom = float(np.abs(ref).max())
    diff = float(np.abs(got - ref).max())
    if not np.isfinite(diff):
        return float("inf")
    return diff / denom if denom > 0 else diff


def check(param: str | Path, bin_path: str | Path | None,
          inputs: Sequence[Mapping[str, Any]], outputs: Sequence[Mapping[str, Any]],
          arrays: Mapping[str, np.ndarray], timeout: float = 900.0) -> dict[str, Any]:
    """`inputs`: [{blob, key, batch_index}], `outputs`: [{blob, key, batch_index}] with
    `key` naming the array in `arrays` (input data / torch reference output)."""
    feeds = {i["blob"]: Feed(np.asarray(arrays[i["key"]]), int(i.get("batch_index", NO_BATCH)))
             for i in inputs}
    fetches = [Fetch(o["blob"], int(o.get("batch_index", NO_BATCH))) for o in outputs]
    res = run_isolated(param, bin_path, feeds, fetches, RunOptions(), timeout=timeout)
    if res.status == "crash":
        return {"kind": "crashes", "signal": res.signal, "detail": res.describe(),
                "ncnn_messages": ncnn_messages(res.stderr)}
    if res.status in ("load_param_failed", "load_model_failed"):
        return {"kind": "load_fails", "detail": res.describe(),
                "ncnn_messages": ncnn_messages(res.stderr)}
    if res.status != "ok":
        return {"kind": "run_fails", "detail": res.describe(),
                "ncnn_messages": ncnn_messages(res.stderr)}
    per_output: dict[str, Any] = {}
    worst = 0.0
    size_mismatch = False
    for o in outputs:
        got = res.outputs[o["blob"]]
        ref = np.asarray(arrays[o["key"]])
        if got.size != ref.size:
            size_mismatch = True
            per_output[o["blob"]] = {"ncnn_shape": list(got.shape), "ref_shape": list(ref.shape)}
            continue
        err = rel_error(got, ref)
        worst = max(worst, err)
        per_output[o["blob"]] = {"rel_err": err}
    kind = "wrong" if size_mismatch or not worst <= REL_TOL else "runs_right"
    out: dict[str, Any] = {"kind": kind, "max_rel_err": None if size_mismatch else worst}
    if kind == "wrong":
        out["outputs"] = per_output
    return out


def check_loads(param: str | Path) -> dict[str, Any]:
    """load_param only, weights served as empty (the real-size `.bin` is not kept)."""
    res = run_isolated(param, None, {}, [], RunOptions(), timeout=300.0)
    if res.status == "crash":
        return {"kind": "crashes", "signal": res.signal, "detail": res.describe()}
    if res.status == "ok":
        return {"kind": "loads"}
    return {"kind": "load_fails", "detail": res.describe(),
            "ncnn_messages": ncnn_messages(res.stderr)}
