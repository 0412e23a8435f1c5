"""ncnn against torch: the graph pnnx wrote against pnnx's own torch export of the same
trace (`X_pnnx.py` + `X.pnnx.bin`), every operand captured, every blob compared with the
operand `mapping.Aligner` pairs it with.

The torch run goes first, in a child writing every operand to a scratch file (memory-
mapped here); the ncnn run streams its blobs one at a time. With a reference `.npz` that
holds torch outputs of the original model (pnnx's fixtures, the repro catalogue), the
graph outputs are also held against those: when pnnx's own export already disagrees with
the model, the bug is in pnnx's trace, before any ncnn layer, and the output layer is
where compare can see it.
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Mapping

import numpy as np

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.core.ncnn import NO_BATCH
from paramsurgery.formats.pnnx_param import Op, Operand, read_pnnx_param
from paramsurgery.formats.io import load
from paramsurgery.runtime.child import Feed
from paramsurgery.verify.compare.expression import conv_padding_terms, subterm_values
from paramsurgery.verify.compare.frames import FrameFile
from paramsurgery.analysis.traced_inputs import input_order, largest_batch, script_batch_axes
from paramsurgery.verify.compare.layout import Error, measure
from paramsurgery.formats.pnnx_mapping import Aligner
from paramsurgery.verify.compare.ncnn_run import NcnnSide, Outcome, extractable_blobs, stream_blobs
from paramsurgery.verify.compare.report import DIFFERS, FAILED, OK, Report
from paramsurgery.verify.compare.rows import blank_report
from paramsurgery.verify.compare.torch_run import (export_files, python_name, raise_for_setup,
                                                   run_torch)


def compare_torch(target: NcnnSide, pnnx_param: str, feeds: Mapping[str, Feed], *,
                  reference_outputs: Mapping[str, np.ndarray] | None = None,
                  atol: float = 1e-4, rtol: float = 1e-3, timeout: float = 600.0) -> Report:
    graph = load(target.param)
    pn = read_pnnx_param(pnnx_param)
    script, _ = export_files(pnnx_param)
    report, rows = blank_report(graph, target.param, f"{pnnx_param} (torch)", "torch", atol, rtol)
    p_ins = pn.inputs
    ins = input_order(graph)[: len(p_ins)]
    dtypes = [o.dtype for o in p_ins]
    axes = script_batch_axes(target.param)
    fed = largest_batch(feeds)
    report.batch_fed = fed
    producer = {b: (layer, i) for layer in graph for i, b in enumerate(layer.outputs)}
    outputs = set(graph.outputs)

    def ok(err: Error) -> bool:
        return err.within(atol, rtol)

    with tempfile.TemporaryDirectory(prefix="paramsurgery-compare-") as tmp:
        scratch = os.path.join(tmp, "torch.frames")
        torch_feeds = {b: torch_feed(feeds[b], o, axes.get(b)) for b, o in zip(ins, p_ins)}
        status, message = run_torch(script, torch_feeds, dtypes, scratch, timeout)
        report.reference_status = status
        raise_for_setup(status, message, script, "compare --pnnx")
        if status != "ok" and not _recorded_any(scratch):
            # nothing to compare with (pnnx writes `self.0 = ...` for a bare nn.Sequential,
            # which does not even parse)
            raise ParamSurgeryError(f"pnnx's torch export did not run ({status}): {message}",
                                    file=script)
        if status != "ok":
            # pnnx's export failed partway (e.g. a tied lm_head called as a 2-input Linear):
            # the operands recorded before the failing line are still compared
            report.notes.append(f"pnnx's torch export stopped partway ({os.path.basename(script)}"
                                f": {message}); blobs after that line are not compared")
        outcome = Outcome()
        from paramsurgery.core import progress

        blobs = extractable_blobs(graph)
        with FrameFile(scratch) as torch_values, progress.task("compare", total=len(blobs),
                                                               unit="blob") as task:
            virtual: dict[str, np.ndarray] = {}
            expanded: dict[int, list[str]] = {}

            def value_of(operand: str) -> np.ndarray | None:
                if "#" in operand:
                    return virtual.get(operand)
                return torch_values.get(python_name(operand))

            def terms(op: Op) -> list[str]:
                """Values inside one pnnx op that ncnn computes as a layer of their own,
                evaluated once from the torch values: an expression's inner terms, a
                conv's non-zero padding."""
                if id(op) not in expanded:
                    names = []
                    inputs = [value_of(i) for i in op.inputs]
                    if op.type == "pnnx.Expression":
                        found = subterm_values(op.params.get("expr", ""), inputs)
                    else:
                        found = conv_padding_terms(op, inputs)
                    for text, value in found:
                        name = f"{op.name}#{text}"
                        virtual[name] = value
                        names.append(name)
                    expanded[id(op)] = names
                return expanded[id(op)]

            aligner = Aligner(graph, pn, ok, terms)
            for ev in _counted(stream_blobs(target, feeds, blobs, outcome, timeout), task):
                row = rows.get(ev.name)
                if row is None or ev.name not in producer:
                    continue
                if ev.error is not None:
                    row.status, row.note = FAILED, ev.error
                    continue
                arr = ev.array
                assert arr is not None
                row.shape = tuple(arr.shape)
                n = int(ev.header.get("n", 1))
                row.batch_n = n

                def judge(operand: str, flat: bool, arr: np.ndarray = arr,
                          n: int = n) -> Error | None:
                    value = value_of(operand)
                    if value is None:
                        return None
                    return measure(arr, value, batch_n=n, flat=flat)

                layer, slot = producer[ev.name]
                placed = aligner.place(layer, slot, judge)
                if (placed.operand is None or placed.error is None) and ev.name in outputs:
                    # a graph output nothing matched by value (a wrong shape, a wrong
                    # value): held against pnnx's output of the same number, so the
                    # layer that writes it is named instead of left uncompared
                    fallback = output_operand(ev.name, pn)
                    err = judge(fallback, False) if fallback is not None else None
                    if err is not None and fallback is not None:
                        row.against, row.how, row.error = fallback, "output", err
                        row.status = OK if ok(err) else DIFFERS
                    continue
                if placed.operand is None or placed.error is None:
                    continue
                row.against, row.how, row.error = placed.operand, placed.how, placed.error
                row.status = OK if ok(placed.error) else DIFFERS
                if reference_outputs is not None and ev.name in outputs and \
                        ev.name in reference_outputs:
                    _against_model(row, arr, n, reference_outputs[ev.name], ok)
    report.status, report.message = outcome.status, outcome.message
    if outcome.status != "ok" and outcome.computing and outcome.computing in rows:
        row = rows[outcome.computing]
        row.status, row.note = FAILED, outcome.message
    return report


def output_operand(blob: str, pn) -> str | None:  # noqa: ANN001 - a PnnxGraph
    """pnnx's output operand for ncnn output `outN` (pnnx numbers both the same way)."""
    m = re.fullmatch(r"out(\d+)", blob)
    outs = pn.outputs
    if m is None or int(m.group(1)) >= len(outs):
        return None
    return outs[int(m.group(1))].name


def _recorded_any(scratch: str) -> bool:
    """Whether the torch run wrote at least one operand before it stopped."""
    if not os.path.isfile(scratch) or os.path.getsize(scratch) == 0:
        return False
    with FrameFile(scratch) as frames:
        return bool(frames.names())


def torch_feed(feed: Feed, operand: "Operand", script_axis: int | None) -> Feed:
    """The array pnnx's torch export takes for an ncnn feed: ncnn is fed without pnnx's
    batch axis (`--inputshape` gives ncnn shapes), the torch script wants the traced rank.
    The axis goes back where pnnx's `X_ncnn.py` puts it, else at the traced shape's first
    size-1 axis."""
    arr = feed.array
    shape = operand.shape
    if shape is None or arr.ndim != len(shape) - 1:
        return feed
    axis = feed.batch_index if feed.batch_index != NO_BATCH else script_axis
    if axis is None or axis == NO_BATCH or not 0 <= axis < len(shape):
        axis = next((i for i, d in enumerate(shape) if d == 1), None)
    if axis is None:
        return feed
    return Feed(np.expand_dims(arr, axis), axis)


def _against_model(row, arr: np.ndarray, n: int, model_out: np.ndarray,
                   ok) -> None:
    """Hold a graph output against the original model's output too."""
    err = measure(arr, model_out, batch_n=n)
    if ok(err):
        return
    pnnx_agrees = row.status == OK
    row.error, row.status = err, DIFFERS
    row.against = f"{row.against} / reference output"
    if pnnx_agrees:
        row.note = ("pnnx's own torch export computes this output differently from the "
                    "model: pnnx lost or changed an op while tracing, upstream of this layer")


def _counted(events, task):
    """The events as they come, each moving `task`'s bar."""
    for ev in events:
        task.done()
        yield ev
