"""Lower pnnx leftovers that have an exact ncnn equivalent (`paramsurgery lower`).

pnnx 20261020 leaves some common torch ops unconverted (`aten::addcmul`, `aten::lerp`,
`aten::frac`, `F.softsign`, `torch.narrow`, ...): ncnn cannot load the graph. Each rule below
rewrites one such op into the ncnn layers that compute the same formula, op for op, as torch's
own definition (the ATen kernel or `torch.nn.functional`). Rules are data: one small function
per rule, with its algebra as a one-line comment, collected in `RULES`; rule sets compose
with `+` and narrow with `.only(...)` / `.without(...)`.

- Scalars pnnx passes as a constant `pnnx.Expression` (addcmul's `value`, lerp's `weight`,
  clamp_min's bound) have their value only in `X.pnnx.param` (pnnx drops `expr=` from the
  ncnn line); the constant, and the Split that fans it out, are removed once unread.
- Element-wise rules need operands of the same traced shape (pnnx's shapes in
  `X.pnnx.param`): torch broadcasting and ncnn's BinaryOp broadcasting differ, so a
  broadcasting op is declined.
- Dims are given to ncnn as negative axes (unaffected by pnnx dropping a leading batch
  axis); dim 0 is declined (it may be pnnx's batch axis, which ncnn layers cannot address).
- Declining rules document leftovers that have no exact ncnn equivalent (exp2, hypot, fmax,
  erfc, where/masked_fill, ...) with the reason.

The results agree with torch up to float rounding of the same operations: torch's vectorised
CPU kernels fuse some multiply-adds (addcmul, lerp), ncnn rounds each op (≤ 1-2 ulp).
A rule that declines makes the pass refuse (nothing written) unless `partial`; leftovers no
rule knows are listed as notes.
"""

from __future__ import annotations

import os
from dataclasses import KW_ONLY, field
from typing import TYPE_CHECKING


from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.core.layer_types import is_converter_leftover
from paramsurgery.passes.shared_tables import share_added_tables
from paramsurgery.passes.base import TRACED_LEN, Pass, PassResult, RepairContext
from paramsurgery.core.changes import Change
from paramsurgery.core.match import MatchFailure
from paramsurgery.passes.lowering import Rule, Rules, Site, BASE_RULES
from paramsurgery.passes.lower_layout import LAYOUT_RULES
from paramsurgery.passes.lower_masks import MASK_RULES
from paramsurgery.passes.lower_values import VALUE_RULES
from paramsurgery.passes.zero_mask import drop_zero_masks
from paramsurgery.passes.eager_attention import fuse_eager_attention

if TYPE_CHECKING:
    from paramsurgery.formats.pnnx_param import PnnxGraph

_DEFAULT: list[Rules] = []


def default_rules() -> Rules:
    """This module's rules + the rule modules built on it (`lower_layout`: slices, slice
    assignment, padding; `lower_values`: arange, casts; `lower_masks`: comparisons,
    masked_fill, expand, repeat). Composed on first use, so a rule module can import this
    one first."""
    if not _DEFAULT:
        _DEFAULT.append(BASE_RULES + LAYOUT_RULES + VALUE_RULES + MASK_RULES)
    return _DEFAULT[0]


def __getattr__(name: str) -> Rules:  # `from paramsurgery.passes.lower import RULES`
    if name == "RULES":
        return default_rules()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ============================================================================ the pass

class Lower(Pass, name="lower", repair_order=20,
            summary="rewrite pnnx leftovers with an exact ncnn equivalent (addcmul, lerp, frac, clamp_min, "
                    "softsign, narrow, ...) into ncnn layers"):
    @classmethod
    def claims(cls, layer: Layer) -> bool:
        r = default_rules().for_type(layer.type)
        return r is not None and not r.doc.startswith("declined:")

    fix_inputs = (TRACED_LEN,)

    @classmethod
    def for_fix(cls, ctx: RepairContext, asked: bool) -> "Lower | None":
        return cls(traced=ctx.pnnx, partial=True, traced_len=ctx.option("traced_len")) \
            if asked else None

    rules: Rules = field(default_factory=default_rules)  # default: every rule
    _: KW_ONLY
    # pnnx's IR (X.pnnx.param, parsed by the command or `fix`; a path is read), with the
    # X_ncnn.py next to it (`trace_evidence`, lowering.Site)
    traced: "PnnxGraph | str | os.PathLike | None" = None
    partial: bool = False
    traced_len: int | None = None  # evidence for frozen_extent when X_ncnn.py is absent

    def __post_init__(self) -> None:
        if not isinstance(self.rules, Rules):  # any iterable of rules (the Python API)
            object.__setattr__(self, "rules", Rules(self.rules))

    def run(self, g: Graph) -> PassResult:
        from paramsurgery.formats.pnnx_param import pnnx_graph

        pnnx = pnnx_graph(self.traced)
        traced_path = pnnx.path if pnnx is not None else None
        result = PassResult(g, False)
        declined: list[tuple[Layer, Rule, str]] = []
        unknown: dict[str, list[str]] = {}
        lowered = 0
        shared: dict = {}
        existing = {layer.id for layer in g}  # what the pass adds may share tables
        if pnnx is not None:
            lowered += self._thaw(g, pnnx, shared, result)
        if g.by_type("torch.where"):  # before the rules: the where it drops is not lowered
            from paramsurgery.analysis.shapes import infer_shapes

            ev = shared.get("evidence")
            fused, left = fuse_eager_attention(g, infer_shapes(g, ev.inputshape if ev else None))
            result.changes.extend(fused)
            result.skipped.extend(left)
            if fused:
                result.modified = True
                lowered += len(fused)
        zero = drop_zero_masks(g, pnnx)  # before the rules: what built the mask goes unread
        if zero:
            result.changes.extend(zero)
            result.modified = True
            lowered += len(zero)
        for layer in list(g):
            if layer.graph is not g:
                continue  # removed by an earlier rewrite (a pruned constant)
            r = self.rules.for_type(layer.type)
            if r is None:
                if is_converter_leftover(layer.type) and layer.type != "pnnx.Expression":
                    unknown.setdefault(layer.type, []).append(layer.name)
                continue
            site = Site(g, layer, pnnx, traced_path, shared=shared)
            try:
                if len(layer.outputs) != 1:
                    raise MatchFailure.declined(f"has {len(layer.outputs)} tops")
                out = r.fn(site)
                bypass = not site.steps and (out in layer.inputs or g.has_blob(out))
                if not bypass and (not site.steps or out != site.steps[-1].out):
                    raise MatchFailure.declined("the rule produced no layer")
            except MatchFailure as exc:  # a rule's declined check or a shared walk's no-match
                declined.append((layer, r, str(exc)))
                continue
            if bypass:
                self._bypass(g, site, r, out, result)
            else:
                self._apply(g, site, r, result)
            lowered += 1
        # a leftover declined on its own may have been removed with a later rewrite's
        # operands (a cast inside a computed pad): only what is still there counts
        declined = [(lay, rr, w) for lay, rr, w in declined if lay.graph is g]
        if declined and not self.partial:
            first, r, why = declined[0]
            more = "".join(f"\n  {lay.where()}: {lay.type} {lay.name!r} ({rr.name}): {w}"
                           for lay, rr, w in declined[1:])
            raise PassRefused(f"{first.type} {first.name!r} ({r.name}): {why}{more}\n"
                              f"(nothing written; --partial lowers the rest and keeps these)",
                              file=first.source_file, line=first.source_line)
        for layer, r, why in declined:
            result.skipped.append(MatchFailure(layer.name, f"{layer.type} kept ({r.name}): {why}",
                                               line=layer.source_line))
        for t, names in unknown.items():
            result.notes.append(f"no rule for {t} ({', '.join(names[:3])}"
                                f"{', ...' if len(names) > 3 else ''})")
        if not lowered and not declined:
            result.notes.insert(0, "no leftover a rule lowers")
        result.contract_changes.extend(shared.get("contracts", []))
        if result.modified:
            result.changes += share_added_tables(g, existing)
            g.insert_splits()  # rules may read a blob another layer reads (an extent's tensor)
        return result

    def _thaw(self, g: Graph, pnnx: "PnnxGraph", shared: dict, result: PassResult) -> int:
        """Constants pnnx folded at the first trace that are the traced length: computed
        from the input instead (`frozen_extent`), before any rule reads them."""
        from paramsurgery.analysis.frozen_extent import thaw, trace_evidence
        from paramsurgery.passes.lower_values import ARANGE_TABLE

        ev = trace_evidence(pnnx, pnnx.path, self.traced_len)
        shared["evidence"] = ev
        changes, kept = thaw(g, pnnx, ev, shared.setdefault("facts", {}), ARANGE_TABLE)
        shared["folds_kept"] = kept  # why: named when a rule meets one of them
        result.changes.extend(changes)
        result.notes.extend(f"{name} kept: {why}" for name, why in kept.items())
        if changes:
            result.modified = True
        return len(changes)

    def _bypass(self, g: Graph, site: Site, r: Rule, keep: str, result: PassResult) -> None:
        """The rule proved the layer returns bottom `keep` unchanged: its readers read that."""
        layer = site.layer
        line = layer.source_line
        before = f"{layer.type}({', '.join(layer.inputs)})"
        old_inputs = list(layer.inputs)
        top = layer.outputs[0]
        if not g.consumers(top):
            raise PassRefused(f"{layer.type} {layer.name!r} passes {keep!r} through, but its top "
                              f"{top!r} is a graph output; keep it", file=layer.source_file,
                              line=line)
        g.replace_uses(top, keep)
        g.remove_layer(layer)
        removed = []
        for b in old_inputs:
            removed.extend(_prune(g, b))
        result.changes.append(Change(layer.name, f"{r.name} [{r.doc}]", before,
                                     f"readers read {keep}", line))
        if removed:
            result.changes.append(Change(layer.name, f"removed unread {', '.join(removed)}",
                                         line=line))
        result.modified = True

    def _apply(self, g: Graph, site: Site, r: Rule, result: PassResult) -> None:
        layer = site.layer
        line = layer.source_line
        before = f"{layer.type}({', '.join(layer.inputs)})"
        old_inputs = list(layer.inputs)
        steps = site.steps
        # readers (distinct steps) of every blob, to give fan-outs their Splits
        readers: dict[str, list[int]] = {}
        for i, st in enumerate(steps):
            for b in dict.fromkeys(st.inputs):
                readers.setdefault(b, []).append(i)
        names: dict[str, str] = {}  # placeholder -> blob name
        copy_for: dict[tuple[str, int], str] = {}

        def fan_out(blob: str, real: str) -> None:
            users = readers.get(blob, [])
            if len(users) < 2:
                return
            outs = [g.unique_blob_name(f"{real}_{layer.name}_{k}") for k in range(len(users))]
            # unique_blob_name only sees blobs already in the graph; keep these distinct
            for k in range(1, len(outs)):
                while outs[k] in outs[:k]:
                    outs[k] = g.unique_blob_name(outs[k] + "_")
            g.add_layer("Split", g.unique_layer_name(f"{layer.name}_split"), [real], outs,
                        before=layer)
            for k, u in enumerate(users):
                copy_for[(blob, u)] = outs[k]

        for b in readers:
            if not b.startswith("%"):
                fan_out(b, b)
        added = []
        for i, st in enumerate(steps):
            ins = [copy_for.get((b, i), names.get(b, b)) for b in st.inputs]
            if i == len(steps) - 1:
                new = g.replace_layer(layer, st.type, layer.name, inputs=ins,
                                      outputs=[layer.outputs[0]], params=st.params)
            else:
                out = g.unique_blob_name(f"{layer.name}_{st.hint}")
                new = g.add_layer(st.type, g.unique_layer_name(f"{layer.name}_{st.hint}"), ins,
                                  [out], st.params, before=layer)
                if st.weights is not None and g.weights is not None:
                    from paramsurgery.formats.weights import set_weights

                    set_weights(new, st.weights)
                names[st.out] = out
                fan_out(st.out, out)
            added.append(f"{new.type} {new.name}")
        removed = []
        for b in old_inputs:
            removed.extend(_prune(g, b))
        after = ", ".join(added)
        result.changes.append(Change(layer.name, f"{r.name} [{r.doc}]", before, after, line))
        if removed:
            result.changes.append(Change(layer.name, f"removed unread {', '.join(removed)}",
                                         line=line))
        result.modified = True


def _prune(g: Graph, blob: str) -> list[str]:
    """Remove what only fed `blob` now that nobody reads it: a Split's unread tops (the Split
    itself when none or one is left) and a constant `pnnx.Expression`."""
    removed: list[str] = []
    work = [blob]
    while work:
        b = work.pop()
        if g.consumers(b):
            continue
        prod = g.producer(b)
        if prod is None:
            continue
        if prod.type == "Split":
            keep = [t for t in prod.outputs if g.consumers(t)]
            if len(keep) >= 2:
                g.set_outputs(prod, keep)
            elif len(keep) == 1:
                g.set_outputs(prod, keep)
                g.bypass(prod)
                removed.append(prod.name)
            else:
                src = prod.inputs[0]
                g.remove_layer(prod)
                removed.append(prod.name)
                work.append(src)
        elif prod.type == "pnnx.Expression" and not prod.inputs and \
                not any(g.consumers(t) for t in prod.outputs):
            g.remove_layer(prod)
            removed.append(prod.name)
        elif prod.type in _PRUNABLE and not any(g.consumers(t) for t in prod.outputs):
            # what only computed a lowered op's operands: shape arithmetic, casts, constants
            work.extend(prod.inputs)
            g.remove_layer(prod)
            removed.append(prod.name)
    return removed


_PRUNABLE = ("pnnx.Expression", "Tensor.to", "MemoryData", "torch.arange", "Tensor.size",
             "aten::size",
             # what computed a mask a rule proved constant (masked_fill's, now unread)
             "Reshape", "ExpandDims", "Squeeze", "Crop", "Clip", "BinaryOp", "UnaryOp",
             "Reduction")
