"""The result of a shape analysis: every blob's shape (numpy order of the `ncnn.Mat`:
`[c, h, w]`, `[c, d, h, w]`), its batch `n`, and where each shape came from."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from paramsurgery.analysis.shapes.affine import Affine, MaybeDim, dim_json, dim_str, evaluate, symbols_of

Shape = tuple  # tuple[MaybeDim, ...]


@dataclass
class ShapeMap:
    """Blob → shape. A shape is a tuple of dims (int, `Affine`, or None = that dim is not
    known); a blob whose rank is not known has no entry."""

    shapes: dict[str, Shape] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)  # blob → input|static|hint|oracle
    batch: dict[str, MaybeDim] = field(default_factory=dict)  # blob → n when it is not 1
    channel_origin: dict[str, int] = field(default_factory=dict)  # blob → layer id of dim 0
    notes: list[str] = field(default_factory=list)  # cross-check disagreements, non-affine
    not_affine: dict[str, str] = field(default_factory=dict)  # blob → why (oracle)
    # (layer id, blob, hinted shape, computed shape) where a -23330 hint disagrees
    hint_conflicts: list[tuple] = field(default_factory=list)

    # ------------------------------------------------------------------ queries
    def shape_of(self, blob: str) -> Shape | None:
        """The blob's shape (dims may be None), or None when even its rank is unknown."""
        return self.shapes.get(blob)

    def known(self, blob: str) -> Shape | None:
        """The shape only when every dim is known."""
        s = self.shapes.get(blob)
        return s if s is not None and all(d is not None for d in s) else None

    def dims(self, blob: str) -> int | None:
        s = self.shapes.get(blob)
        return None if s is None else len(s)

    def n(self, blob: str) -> MaybeDim:
        return self.batch.get(blob, 1)

    def channels(self, blob: str) -> int | None:
        """The outermost extent (c of a 3-D/4-D blob, h of a 2-D one) when it is a number."""
        s = self.shapes.get(blob)
        if not s or not isinstance(s[0], int):
            return None
        return s[0]

    def symbols(self) -> list[str]:
        out: dict[str, None] = {}
        for s in self.shapes.values():
            for d in s:
                for sym in symbols_of(d):
                    out[sym] = None
        return list(out)

    def concrete(self, blob: str, env: Mapping[str, int]) -> tuple[int, ...] | None:
        s = self.known(blob)
        return None if s is None else tuple(evaluate(d, env) for d in s)

    def __contains__(self, blob: object) -> bool:
        return blob in self.shapes

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    # ------------------------------------------------------------------ output
    def to_json(self, order: list[str] | None = None) -> dict:
        blobs = {}
        for b in order if order is not None else list(self.shapes):
            s = self.shapes.get(b)
            entry: dict = {"shape": None if s is None else [dim_json(d) for d in s],
                           "dims": None if s is None else len(s)}
            n = self.batch.get(b)
            if n not in (None, 1):
                entry["n"] = dim_json(n)
            if b in self.source:
                entry["source"] = self.source[b]
            if b in self.not_affine:
                entry["not_affine"] = self.not_affine[b]
            blobs[b] = entry
        return {"blobs": blobs, "notes": list(self.notes)}

    @staticmethod
    def format_shape(s: Shape | None) -> str:
        return "?" if s is None else "[" + ", ".join(dim_str(d) for d in s) + "]"


def is_symbolic(d: MaybeDim) -> bool:
    return isinstance(d, Affine)
