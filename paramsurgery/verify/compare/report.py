"""What a comparison found: one row per blob of the graph under test, in graph order,
the first divergence, coverage, and the text / JSON renderings.

The first divergence is the earliest layer (in the order the `.param` lists them) with a
compared output out of tolerance while every input is clean: compared and within
tolerance, or not compared but computed only from clean blobs. Later differences that
are only that error travelling downstream are not divergences of their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from paramsurgery.verify.compare.layout import Error
from paramsurgery.patterns.match import visit_once

OK = "ok"
DIFFERS = "differs"
UNMATCHED = "unmatched"
FAILED = "failed"    # ncnn could not produce the blob (extract failed, crash before it)
SKIPPED = "skipped"  # not comparable by design (opaque kv-cache buffers)


@dataclass
class BlobRow:
    blob: str
    layer: str
    type: str
    line: int | None
    status: str = UNMATCHED
    against: str | None = None   # the reference blob or pnnx operand it was compared with
    how: str | None = None       # name | structure | split | operand | boundary | ...
    error: Error | None = None
    shape: tuple[int, ...] | None = None
    note: str | None = None
    batch_n: int = 1             # ncnn's batch size of the blob

    def to_json(self) -> dict[str, Any]:
        e = self.error
        return {"blob": self.blob, "layer": self.layer, "type": self.type, "line": self.line,
                "status": self.status, "against": self.against, "match": self.how,
                "shape": list(self.shape) if self.shape is not None else None,
                "max_abs": _num(e.max_abs) if e and e.shape is None else None,
                "rel": _num(e.rel) if e and e.shape is None else None,
                "shape_mismatch": e.shape if e else None,
                **({"note": self.note} if self.note else {})}


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else ("inf" if x > 0 else "nan")


@dataclass
class Report:
    target: str
    reference: str
    mode: str                     # "ncnn" | "torch"
    atol: float
    rtol: float
    rows: list[BlobRow] = field(default_factory=list)
    status: str = "ok"            # the target run: ok | crash | load_param_failed | ...
    message: str = ""
    reference_status: str = "ok"
    notes: list[str] = field(default_factory=list)
    layer_inputs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # layer -> bottoms
    batch_fed: int = 1            # the largest ncnn batch the inputs carried

    @property
    def compared(self) -> list[BlobRow]:
        return [r for r in self.rows if r.status in (OK, DIFFERS)]

    def first_divergence(self) -> BlobRow | None:
        """The earliest layer whose outputs differ while all its inputs agree - or, when
        such a layer's output has the wrong shape and it reads a blob that carries a torch
        axis in ncnn's batch axis (more items than any input fed), the layer that moved
        it there: the values were right until a layer computed across the items (pnnx's
        `Reshape ... 12=233 13=k`)."""
        found = self._first_differing()
        if found is None:
            return None
        mover = self._batch_mover(found)
        return found if mover is None else mover

    def _batch_mover(self, found: BlobRow) -> BlobRow | None:
        if found.error is None or found.error.shape is None:
            # wrong values in the right layout: that layer's own doing (a layer running
            # per item on a batch pnnx made on purpose is fine)
            return None
        rows = {r.blob: r for r in self.rows}
        limit = max(self.batch_fed, 1)
        start = [b for b in self.layer_inputs.get(found.layer, ())
                 if b in rows and rows[b].batch_n > limit]
        def ups(b: str) -> list[str]:
            return [u for u in self.layer_inputs.get(rows[b].layer, ())
                    if u in rows and rows[u].batch_n > limit]

        mover: BlobRow | None = None
        for b in visit_once(start, ups):
            row = rows[b]
            if not ups(b) and (mover is None or (row.line or 0) < (mover.line or 0)):
                mover = row
        if mover is None:
            return None
        e = found.error
        shown = (f"shape {e.shape}" if e is not None and e.shape else
                 f"max_abs {e.max_abs:.3g}" if e is not None else found.status)
        return BlobRow(mover.blob, mover.layer, mover.type, mover.line, DIFFERS, mover.against,
                       mover.how, found.error, mover.shape,
                       f"moves a torch axis into ncnn's batch axis (n={mover.batch_n}, the "
                       f"inputs fed {limit}): its values are right, but {found.layer} "
                       f"({found.type}, line {found.line}) then runs once per item: {shown}",
                       mover.batch_n)

    def _first_differing(self) -> BlobRow | None:
        clean: dict[str, bool] = {}
        by_layer: dict[str, list[BlobRow]] = {}
        for r in self.rows:
            by_layer.setdefault(r.layer, []).append(r)
        for layer, rows in by_layer.items():
            ins_clean = all(clean.get(b, True) for b in self.layer_inputs.get(layer, ()))
            bad = [r for r in rows if r.status == DIFFERS or r.status == FAILED]
            if bad and ins_clean:
                return bad[0]
            for r in rows:
                clean[r.blob] = ins_clean and r.status not in (DIFFERS, FAILED)
        return None

    def to_json(self) -> dict[str, Any]:
        fd = self.first_divergence()
        return {
            "target": self.target, "reference": self.reference, "mode": self.mode,
            "status": self.status, **({"message": self.message} if self.message else {}),
            "atol": self.atol, "rtol": self.rtol,
            "first_divergence": None if fd is None else {
                "layer": fd.layer, "line": fd.line, "type": fd.type, "blob": fd.blob,
                "against": fd.against,
                "max_abs": _num(fd.error.max_abs) if fd.error else None,
                "rel": _num(fd.error.rel) if fd.error else None,
                **({"shape_mismatch": fd.error.shape} if fd.error and fd.error.shape else {}),
                **({"note": fd.note} if fd.note else {})},
            "coverage": {"compared": len(self.compared), "blobs": len(self.rows)},
            "notes": self.notes,
            "blobs": [r.to_json() for r in self.rows],
        }

    def format_text(self, show_all: bool = False) -> str:
        """ruff-like: `file:line: layer (Type) blob  max_abs  rel  status`, then a summary."""
        lines = []
        fd = self.first_divergence()
        for r in self.rows:
            if r.status == UNMATCHED and not show_all:
                continue
            where = f"{self.target}:{r.line}" if r.line is not None else self.target
            if r.error is not None and r.error.shape is not None:
                err = f"shape {r.error.shape}"
            elif r.error is not None:
                err = f"max_abs {r.error.max_abs:.3g}  rel {r.error.rel:.3g}"
            else:
                err = r.note or ""
            status = r.status
            mark = ""
            if fd is not None and r.blob == fd.blob:
                mark = "  <- first divergence"
                if fd is not r:  # the layer that moved an axis into ncnn's batch
                    status, err = "batch", f"n={r.batch_n}, values right"
            against = f" ~ {r.against}" if r.against and r.how != "name" else ""
            lines.append(f"{where}: {r.layer} ({r.type}) {r.blob}{against}  {status}  "
                         f"{err}{mark}".rstrip())
        for n in self.notes:
            lines.append(f"note: {n}")
        if self.status != "ok":
            lines.append(f"{self.target}: ncnn run {self.status}"
                         + (f": {self.message}" if self.message else ""))
        cov = f"{len(self.compared)}/{len(self.rows)} blobs compared"
        pct = 100.0 * len(self.compared) / len(self.rows) if self.rows else 0.0
        n_diff = sum(r.status == DIFFERS for r in self.rows)
        if fd is None:
            verdict = "no divergence" if self.status == "ok" and self.reference_status == "ok" \
                else "no divergence before the failure"
        else:
            e = fd.error
            how = (fd.note if fd.note and fd.status == DIFFERS and fd.batch_n > 1 else
                   f"shape {e.shape}" if e and e.shape else
                   f"max_abs {e.max_abs:.3g}, rel {e.rel:.3g}" if e else fd.note or fd.status)
            verdict = (f"first divergence: {fd.layer} ({fd.type}) at line {fd.line}, "
                       f"blob {fd.blob}: {how}")
        lines.append(f"{verdict}; {n_diff} blobs differ; {cov} ({pct:.0f}% coverage) "
                     f"against {self.reference} (atol {self.atol:g}, rtol {self.rtol:g})")
        return "\n".join(lines)
