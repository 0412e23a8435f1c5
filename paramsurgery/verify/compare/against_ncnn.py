"""ncnn against ncnn: the same inputs through two graphs (an edit, a pass, other Option
settings), every blob of the target compared with its counterpart as it is produced.

Memory: the reference runs first, in a child that writes only the blobs the target needs
to a scratch file; the target then runs in a second child whose blobs arrive one at a time
through a pipe and are compared with the memory-mapped reference and dropped. The parent
never holds more than one blob of each side.
"""

from __future__ import annotations

import os
import tempfile
from typing import Mapping

import numpy as np

from paramsurgery.formats.io import load
from paramsurgery.runtime.child import Feed, FeedLike, _as_feed
from paramsurgery.verify.compare.frames import FrameFile
from paramsurgery.verify.compare.graph_match import match_graphs
from paramsurgery.analysis.traced_inputs import largest_batch
from paramsurgery.verify.compare.layout import measure
from paramsurgery.verify.compare.ncnn_run import (NcnnSide, Outcome, extractable_blobs, run_to_file,
                                                  stream_blobs)
from paramsurgery.verify.compare.options import describe
from paramsurgery.verify.compare.report import DIFFERS, FAILED, OK, Report
from paramsurgery.verify.compare.rows import blank_report


def compare_ncnn(target: NcnnSide, reference: NcnnSide, feeds: Mapping[str, FeedLike], *,
                 reference_feeds: Mapping[str, FeedLike] | None = None, atol: float = 1e-4,
                 rtol: float = 1e-3, timeout: float = 600.0) -> Report:
    """Compare every blob of `target` with its counterpart in `reference`. Both run on
    `feeds` (by input name, through the blob pairing) unless the reference's inputs differ
    (a pass that packed them: `reference_feeds`); inputs left out are fed empty."""
    tg = load(target.param)
    rg = load(reference.param)
    different: frozenset[str] = frozenset()
    if reference_feeds is not None:
        different = frozenset(b for b in tg.inputs if b not in reference_feeds or not
                              _same_feed(feeds.get(b), reference_feeds[b]))
    pairs = match_graphs(tg, rg, different)
    ref_label = reference.param
    if os.path.abspath(reference.param) == os.path.abspath(target.param):
        ref_label = f"{reference.param} [{describe(reference.settings)}]"
    report, rows = blank_report(tg, target.param, ref_label, "ncnn", atol, rtol)
    report.batch_fed = largest_batch(feeds)
    if describe(target.settings) != describe(reference.settings):
        report.notes.append(f"options: target {describe(target.settings)}, reference "
                            f"{describe(reference.settings)}")
    ref_inputs = set(rg.inputs)
    ref_feeds: dict[str, FeedLike] = dict(reference_feeds or {})
    for blob, feed in feeds.items() if reference_feeds is None else ():
        image = pairs.get(blob, (blob,))[0]
        if image in ref_inputs:
            ref_feeds[image] = feed
    for blob in rg.inputs:
        ref_feeds.setdefault(blob, Feed(np.zeros((0,), np.float32)))
    wanted = {img for img, _ in pairs.values()}
    ref_blobs = [(b, t) for b, t in extractable_blobs(rg) if b in wanted]
    with tempfile.TemporaryDirectory(prefix="paramsurgery-compare-") as tmp:
        scratch = os.path.join(tmp, "reference.frames")
        ref_out = run_to_file(reference, ref_feeds, ref_blobs, scratch, timeout)
        report.reference_status = ref_out.status
        if ref_out.status != "ok":
            report.notes.append(f"the reference run ended early: {ref_out.status}"
                                + (f" ({ref_out.message})" if ref_out.message else ""))
        outcome = Outcome()
        from paramsurgery.core import progress

        blobs = extractable_blobs(tg)
        with FrameFile(scratch) as ref, progress.task("compare", total=len(blobs),
                                                      unit="blob") as task:
            for ev in stream_blobs(target, feeds, blobs, outcome, timeout):
                task.done()  # the bar moves per blob; the rows are the report's
                row = rows.get(ev.name)
                if row is None:
                    continue
                hit = pairs.get(ev.name)
                if ev.error is not None:
                    row.status, row.note = FAILED, ev.error
                    continue
                assert ev.array is not None
                row.shape = tuple(ev.array.shape)
                row.batch_n = int(ev.header.get("n", 1))
                if hit is None:
                    continue
                expected = ref.get(hit[0])
                if expected is None:
                    row.note = "not produced by the reference run"
                    continue
                err = measure(ev.array, expected, batch_n=int(ev.header.get("n", 1)))
                row.against, row.how, row.error = hit[0], hit[1], err
                row.status = OK if err.within(atol, rtol) else DIFFERS
                del expected
    report.status, report.message = outcome.status, outcome.message
    if outcome.status != "ok" and outcome.computing and outcome.computing in rows:
        row = rows[outcome.computing]
        row.status, row.note = FAILED, outcome.message
    return report


def _same_feed(a: FeedLike | None, b: FeedLike) -> bool:
    if a is None:
        return False
    fa, fb = _as_feed(a), _as_feed(b)
    return fa.batch_index == fb.batch_index and fa.array.shape == fb.array.shape and \
        bool(np.array_equal(fa.array, fb.array))
