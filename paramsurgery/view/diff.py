"""Semantic diff of two graphs: which layers were added, removed, renamed or changed (type,
params by value, bottoms, tops, weights by content hash).

Matching, linear in the graph size:
1. by name: the k-th layer named N in A pairs with the k-th named N in B;
2. by structure, for the rest, in B's file order: an unpaired B layer pairs with the first
   unpaired A layer of the same type reading the same blobs, where a B blob is translated
   to A through the pairs already made (the producer's top in the same slot), so a chain
   of renamed layers with renamed blobs is followed down; among several candidates one
   with the same params wins.

Blob names are compared as written, except a blob that no longer exists in B, which is
compared through the pairs (a blob renamed everywhere changes its producer's tops, not
every reader).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph
    from paramsurgery.ir.layer import Layer


@dataclass
class LayerChange:
    """One paired layer that differs. Each field is None when that part is the same,
    else (before, after)."""

    layer: str  # the name in B
    type: str  # the type in B
    before_name: str
    type_change: tuple[str, str] | None = None
    params: dict[int, tuple[Any, Any]] | None = None  # id -> (before, after); None = absent
    inputs: tuple[list[str], list[str]] | None = None
    outputs: tuple[list[str], list[str]] | None = None
    weights: tuple[str, str] | None = None  # sha256 of the layer's weights

    def to_json(self) -> dict[str, Any]:
        return {"layer": self.layer, "type": list(self.type_change) if self.type_change else None,
                "params": None if self.params is None else
                {str(k): [_plain(b), _plain(a)] for k, (b, a) in self.params.items()},
                "inputs": None if self.inputs is None else
                {"before": self.inputs[0], "after": self.inputs[1]},
                "outputs": None if self.outputs is None else
                {"before": self.outputs[0], "after": self.outputs[1]},
                "weights": None if self.weights is None else
                {"before": self.weights[0], "after": self.weights[1]}}

    def box_lines(self, width: int = 40) -> list[str]:
        """What changed, as box lines of about `width` characters, nothing cut: every
        param with its value before and after, the bottoms and tops that came and went,
        the weights."""
        from paramsurgery.core.layer_params import param_name

        out: list[str] = []
        if self.type_change:
            out.append(f"type {self.type_change[0]} → {self.type_change[1]}")
        for k, (b, a) in (self.params or {}).items():
            out.extend(_wrap_words(f"{param_name(self.type, k)}: {_show(b)} → {_show(a)}",
                                   width))
        for what, pair in (("in", self.inputs), ("out", self.outputs)):
            if pair is None:
                continue
            before, after = pair
            gone = [x for x in before if x not in after]
            new = [x for x in after if x not in before]
            if not gone and not new:
                out.append(f"{what}: order {' '.join(before)} → {' '.join(after)}")
            if gone:
                out.extend(_wrap_words(f"-{what}: " + " ".join(gone), width))
            if new:
                out.extend(_wrap_words(f"+{what}: " + " ".join(new), width))
        if self.weights:
            out.append(f"weights {self.weights[0][:8]} → {self.weights[1][:8]}")
        return out

    def format(self) -> list[str]:
        lines = [f"~ {self.layer} ({self.type})"]
        if self.type_change:
            lines.append(f"    type: {self.type_change[0]} -> {self.type_change[1]}")
        if self.params:
            from paramsurgery.core.layer_params import param_name

            lines.append("    params: " + ", ".join(
                f"{param_name(self.type, k)}: {_show(b)} -> {_show(a)}"
                for k, (b, a) in self.params.items()))
        if self.inputs:
            lines.append(f"    inputs: {' '.join(self.inputs[0]) or '-'} -> "
                         f"{' '.join(self.inputs[1]) or '-'}")
        if self.outputs:
            lines.append(f"    outputs: {' '.join(self.outputs[0]) or '-'} -> "
                         f"{' '.join(self.outputs[1]) or '-'}")
        if self.weights:
            lines.append(f"    weights: sha256 {self.weights[0][:12]} -> {self.weights[1][:12]}")
        return lines


@dataclass
class GraphDiff:
    a_path: str
    b_path: str
    added: list["Layer"] = field(default_factory=list)  # B layers
    removed: list["Layer"] = field(default_factory=list)  # A layers
    renamed: list[tuple[str, str]] = field(default_factory=list)
    changed: list[LayerChange] = field(default_factory=list)
    pairs: dict[int, int] = field(default_factory=dict)  # A layer id -> B layer id
    sizes: tuple[int, int] = (0, 0)

    @property
    def same(self) -> bool:
        return not (self.added or self.removed or self.renamed or self.changed)

    def touched(self) -> set[str]:
        """Every layer name the diff mentions (A names of removed, B names otherwise)."""
        return ({lay.name for lay in self.added} | {lay.name for lay in self.removed}
                | {c.layer for c in self.changed} | {b for _, b in self.renamed})

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a_path, "b": self.b_path,
                "added": [lay.name for lay in self.added],
                "removed": [lay.name for lay in self.removed],
                "changed": [c.to_json() for c in self.changed],
                "renamed": [{"from": a, "to": b} for a, b in self.renamed]}

    def stat(self) -> str:
        """`git diff --stat`-like: per layer type, how many layers were added (+), removed
        (-), changed (~) or renamed (=), then the totals."""
        per: dict[str, list[int]] = {}
        for lay in self.added:
            per.setdefault(lay.type, [0, 0, 0, 0])[0] += 1
        for lay in self.removed:
            per.setdefault(lay.type, [0, 0, 0, 0])[1] += 1
        for c in self.changed:
            per.setdefault(c.type, [0, 0, 0, 0])[2] += 1
        renamed_only = {b for _, b in self.renamed} - {c.layer for c in self.changed}
        b_types = self._b_types
        for name in renamed_only:
            per.setdefault(b_types.get(name, "?"), [0, 0, 0, 0])[3] += 1
        width = max((len(t) for t in per), default=0)
        lines = []
        for t in sorted(per):
            counts = per[t]
            bar = "".join(ch * min(n, 30) for ch, n in zip("+-~=", counts))
            lines.append(f" {t:<{width}} | {sum(counts):>4} {bar}")
        lines.append(f" {len(self.added)} added, {len(self.removed)} removed, "
                     f"{len(self.changed)} changed, {len(self.renamed)} renamed "
                     f"({self.sizes[0]} -> {self.sizes[1]} layers)")
        return "\n".join(lines)

    _b_types: dict[str, str] = field(default_factory=dict, repr=False)

    def format(self) -> str:
        if self.same:
            return f"{self.a_path} and {self.b_path}: no semantic difference"
        out = [f"--- {self.a_path}", f"+++ {self.b_path}", self.stat()]
        if self.removed:
            out.append("removed:")
            out.extend(f"  - {lay.type} {lay.name}" + _where(lay) for lay in self.removed)
        if self.added:
            out.append("added:")
            out.extend(f"  + {lay.type} {lay.name}" + _where(lay) for lay in self.added)
        if self.renamed:
            out.append("renamed:")
            out.extend(f"  = {a} -> {b}" for a, b in self.renamed)
        if self.changed:
            out.append("changed:")
            for c in self.changed:
                out.extend("  " + line for line in c.format())
        return "\n".join(out)


def diff_graphs(a: "Graph", b: "Graph", *, a_path: str | None = None,
                b_path: str | None = None) -> GraphDiff:
    """Pair the layers of `a` and `b` and describe every difference."""
    pairs: dict[int, int] = {}  # a id -> b id
    paired_b: set[int] = set()
    a_by_name: dict[str, list["Layer"]] = {}
    for lay in a:
        a_by_name.setdefault(lay.name, []).append(lay)
    seen_b: dict[str, int] = {}
    for lay in b:
        k = seen_b.get(lay.name, 0)
        seen_b[lay.name] = k + 1
        cands = a_by_name.get(lay.name)
        if cands and k < len(cands):
            pairs[cands[k].id] = lay.id
            paired_b.add(lay.id)
    # structural pairing of the rest
    unpaired_a: dict[tuple, list["Layer"]] = {}
    for lay in a:
        if lay.id not in pairs:
            unpaired_a.setdefault((lay.type, lay.inputs), []).append(lay)
    b_to_a_blob: dict[str, str] = {}
    for a_id, b_id in pairs.items():
        for xa, xb in zip(a.layer(a_id).outputs, b.layer(b_id).outputs):
            b_to_a_blob[xb] = xa
    for lay in b:
        if lay.id in paired_b:
            continue
        key = (lay.type, tuple(b_to_a_blob.get(x, x) for x in lay.inputs))
        cands = unpaired_a.get(key)
        if not cands:
            continue
        pick = next((c for c in cands if c.params == lay.params), cands[0])
        cands.remove(pick)
        pairs[pick.id] = lay.id
        paired_b.add(lay.id)
        for xa, xb in zip(pick.outputs, lay.outputs):
            b_to_a_blob[xb] = xa
    a_to_b_blob = {xa: xb for xb, xa in b_to_a_blob.items()}
    d = GraphDiff(a_path or a.source.path or "a", b_path or b.source.path or "b",
                  pairs=pairs, sizes=(len(a), len(b)))
    d.removed = [lay for lay in a if lay.id not in pairs]
    d.added = [lay for lay in b if lay.id not in paired_b]
    b_id_to_a = {v: k for k, v in pairs.items()}
    for lb in b:
        paired = b_id_to_a.get(lb.id)
        if paired is None:
            continue
        la = a.layer(paired)
        if la.name != lb.name:
            d.renamed.append((la.name, lb.name))
        change = _compare(la, lb, b, a_to_b_blob)
        if change is not None:
            d.changed.append(change)
    d._b_types = {lay.name: lay.type for lay in b}
    return d


def _compare(la: "Layer", lb: "Layer", b: "Graph",
             a_to_b_blob: dict[str, str]) -> LayerChange | None:
    c = LayerChange(lb.name, lb.type, la.name)
    if la.type != lb.type:
        c.type_change = (la.type, lb.type)
    pa, pb = la.params.to_dict(), lb.params.to_dict()
    if pa != pb:
        c.params = {k: (pa.get(k), pb.get(k)) for k in sorted(set(pa) | set(pb))
                    if pa.get(k) != pb.get(k)}
    if not _same_blobs(la.inputs, lb.inputs, b, a_to_b_blob):
        c.inputs = (list(la.inputs), list(lb.inputs))
    if list(la.outputs) != list(lb.outputs):
        c.outputs = (list(la.outputs), list(lb.outputs))
    wa, wb = la.weights, lb.weights
    if wa is not None and wb is not None and not wa.same_bytes(wb):
        c.weights = (wa.sha256, wb.sha256)
    if c.type_change or c.params or c.inputs or c.outputs or c.weights:
        return c
    return None


def _same_blobs(xa: tuple[str, ...], xb: tuple[str, ...], b: "Graph",
                a_to_b_blob: dict[str, str]) -> bool:
    if len(xa) != len(xb):
        return False
    for x, y in zip(xa, xb):
        if x != y and (b.has_blob(x) or a_to_b_blob.get(x) != y):
            return False
    return True


def _wrap_words(text: str, width: int) -> list[str]:
    """`text` in lines of about `width` characters, broken between words or after the
    commas of a value list; nothing is dropped."""
    pieces = [p for p in text.replace(",", ",\0").replace(" ", " \0").split("\0") if p]
    out: list[str] = []
    cur = ""
    for piece in pieces:
        if cur.strip() and len(cur) + len(piece.rstrip()) > width:
            out.append(cur.rstrip())
            cur = "  "
        cur += piece
    if cur.strip():
        out.append(cur.rstrip())
    return out


def _where(lay: "Layer") -> str:
    return f" (line {lay.source_line})" if lay.source_line is not None else ""


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return list(v)
    return v


def _show(v: Any) -> str:
    if v is None:
        return "(unset)"
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v))
    return str(v)
