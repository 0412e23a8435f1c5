"""The outputs of pnnx's torch export for `precision --pnnx`: the reference a reduced-precision
build is held against is then the model itself (torch fp32), not ncnn's own fp32 run.

pnnx's `X_pnnx.py` (with `X.pnnx.bin`) runs in a child on the same feeds as ncnn (given back
pnnx's batch axis, as `compare --pnnx` does); each graph output `outN` is paired with pnnx's
N-th output operand, as pnnx numbers both. Only the outputs are taken: the per-layer
figures of the search stay against ncnn's fp32 run, where every blob exists.
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from paramsurgery.analysis.traced_inputs import input_order, script_batch_axes
from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.formats.pnnx_param import read_pnnx_param
from paramsurgery.runtime.child import Feed
from paramsurgery.verify.compare.against_torch import output_operand, torch_feed
from paramsurgery.verify.compare.frames import FrameFile
from paramsurgery.verify.compare.torch_run import (export_files, python_name, raise_for_setup,
                                                   run_torch)

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph


def torch_outputs(graph: "Graph", param: str, pnnx_param: str, feeds: Mapping[str, Feed],
                  outputs: Sequence[str], timeout: float = 600.0) -> dict[str, np.ndarray]:
    """torch's value of every blob in `outputs` (graph outputs), from pnnx's export run on
    `feeds`. ParamSurgeryError (located at the script) when the export does not run to the
    end or has no operand for an output; MissingDependency without torch."""
    pn = read_pnnx_param(pnnx_param)
    script, _ = export_files(pnnx_param)
    ins = input_order(graph)[: len(pn.inputs)]
    axes = script_batch_axes(param)
    missing = [b for b in ins if b not in feeds]
    if missing:
        raise ParamSurgeryError(f"pnnx's export takes {len(pn.inputs)} input(s); no feed for "
                                f"{', '.join(missing)}", file=pnnx_param)
    torch_feeds = {b: torch_feed(feeds[b], o, axes.get(b)) for b, o in zip(ins, pn.inputs)}
    with tempfile.TemporaryDirectory(prefix="paramsurgery-precision-") as tmp:
        scratch = os.path.join(tmp, "torch.frames")
        status, message = run_torch(script, torch_feeds, [o.dtype for o in pn.inputs], scratch,
                                    timeout)
        raise_for_setup(status, message, script, "precision --pnnx")
        if status != "ok":
            raise ParamSurgeryError(f"pnnx's torch export did not run to its end ({status}: "
                                    f"{message}); --pnnx needs its outputs (without --pnnx the "
                                    f"reference is ncnn's fp32 run)", file=script)
        found: dict[str, np.ndarray] = {}
        with FrameFile(scratch) as frames:
            for blob in outputs:
                operand = output_operand(blob, pn)
                value = frames.get(python_name(operand)) if operand is not None else None
                if value is None:
                    raise ParamSurgeryError(f"pnnx's export has no output for {blob!r} (pnnx "
                                            f"numbers its outputs as ncnn's out0, out1, ...)",
                                            file=pnnx_param)
                found[blob] = np.array(value, copy=True)  # the frames are memory-mapped
    return found


def aligned(torch_value: np.ndarray, ncnn_value: np.ndarray, blob: str) -> np.ndarray:
    """torch's output in ncnn's shape: the same values without pnnx's batch axis (ncnn's
    blobs carry none). ParamSurgeryError when the sizes differ (not the same tensor)."""
    if torch_value.size != ncnn_value.size:
        raise ParamSurgeryError(f"output {blob!r}: torch gives shape "
                                f"{tuple(torch_value.shape)}, ncnn {tuple(ncnn_value.shape)}: "
                                f"not the same tensor; --pnnx cannot be the reference here")
    return np.asarray(torch_value, np.float32).reshape(ncnn_value.shape)
