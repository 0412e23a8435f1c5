"""Run a repro graph through ncnn (in a child process) and classify the outcome with the
catalogue's vocabulary: right / wrong / load_fail / crash. Shared by the fixture generator,
the tests and `paramsurgery repro check`; needs numpy and ncnn only."""

from __future__ import annotations

import math
import signal as _signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paramsurgery.repro.cases import compare_outputs, ncnn_feeds, ncnn_fetches
from paramsurgery.runtime.child import NO_BATCH, RunResult, run_isolated


@dataclass
class Reference:
    """Inputs fed to ncnn and the torch outputs they must give, with pnnx's batch axes."""

    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    input_batch_index: dict[str, int]
    output_batch_index: dict[str, int]

    def arrays(self) -> dict[str, np.ndarray]:
        """The ref.npz layout: in0.., out0.., batch_index_<blob> int32 scalars."""
        out: dict[str, np.ndarray] = {}
        for i, a in enumerate(self.inputs):
            out[f"in{i}"] = a
        for i, a in enumerate(self.outputs):
            out[f"out{i}"] = a
        for blob, b in {**self.input_batch_index, **self.output_batch_index}.items():
            out[f"batch_index_{blob}"] = np.array(b, dtype=np.int32)
        return out


def load_reference(path: str | Path) -> Reference:
    with np.load(path, allow_pickle=False) as z:
        keys = set(z.files)
        n_in = sum(1 for k in keys if k.startswith("in") and k[2:].isdigit())
        n_out = sum(1 for k in keys if k.startswith("out") and k[3:].isdigit())
        inputs = [z[f"in{i}"] for i in range(n_in)]
        outputs = [z[f"out{i}"] for i in range(n_out)]
        bidx = {k[len("batch_index_"):]: int(z[k]) for k in keys if k.startswith("batch_index_")}
    return Reference(inputs, outputs,
                     {f"in{i}": bidx.get(f"in{i}", NO_BATCH) for i in range(n_in)},
                     {f"out{i}": bidx.get(f"out{i}", NO_BATCH) for i in range(n_out)})


def run_reference(param: str | Path, bin: str | Path | None, ref: Reference,
                  timeout: float = 300.0) -> RunResult:
    """Feed the reference inputs to the graph in a child process and fetch out0.."""
    feeds = ncnn_feeds(ref.inputs, ref.input_batch_index)
    fetches = ncnn_fetches(len(ref.outputs), ref.output_batch_index)
    return run_isolated(param, bin, feeds, fetches, timeout=timeout)


def signal_name(sig: int | None) -> str | None:
    if sig is None:
        return None
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def rounded(x: float | None) -> float | str | None:
    """3 significant digits (what matters, and stable across rebuilds); JSON has no
    inf/nan, so those become strings."""
    if x is None:
        return None
    if not math.isfinite(x):
        return str(x)
    return float(f"{x:.3g}")


def _tail(text: str, n: int) -> list[str]:
    return [ln.rstrip() for ln in text.splitlines() if ln.strip()][-n:]


def classify(run: RunResult, ref_outputs: list[np.ndarray],
             nondeterministic: str | None = None) -> dict[str, Any]:
    """Status and evidence of one isolated run. `nondeterministic` (the reason) drops the
    error value of a wrong result, which then changes from run to run."""
    out: dict[str, Any] = {"ncnn_status": run.status, "ncnn_message": run.message or None,
                           "ncnn_stderr": _tail(run.stderr, 20), "signal": run.signal,
                           "signal_name": signal_name(run.signal), "max_abs_err": None,
                           "output_shapes": None, "compare_message": None}
    if run.status == "crash":
        out["status"] = "crash"
    elif run.status in ("load_param_failed", "load_model_failed"):
        out["status"] = "load_fail"
    elif run.status == "ok":
        names = sorted(run.outputs, key=lambda s: int(s[3:]))
        cmp = compare_outputs([run.outputs[n] for n in names], ref_outputs)
        out["status"] = cmp.status
        out["output_shapes"] = [{"ncnn": g, "torch": r} for g, r in cmp.shapes]
        if nondeterministic and cmp.status == "wrong":
            out["nondeterministic"] = nondeterministic
        else:
            out["max_abs_err"] = rounded(cmp.max_abs)
            out["compare_message"] = cmp.message or None
    else:
        # input/extract failure, timeout, child error: the graph loaded but gave no usable
        # result; counted as wrong, ncnn_status says which
        out["status"] = "wrong"
    return out
