"""Fuse N codebook lookups into one offset `Embed` (`paramsurgery fuse-codebooks`).

Residual-VQ decoders and multi-codebook LMs (the Qwen3-TTS code predictor's 15 tables, its
codec decoder's 15 acoustic codebooks) look up N tables, one id input each, and add the
rows. One `Embed` over the concatenated tables does the same with one input and one
kernel launch:

    Input ids_g -> Embed_g (vocab_g x d) [-> layout chain] --sum over g-->  s
    ==>
    Input ids -> Embed (sum vocab_g x d) -> Reshape [d, T, N] -> Reduction SUM axis 0
              [-> the same layout chain, once] -> s

**Caller contract** (qwen3-tts.md §7): ids are int32 bit patterns that ncnn `Embed` reads
directly; any arithmetic on them in the graph would run in float on those bits (pnnx-bugs
case 6b). So the offset of group g, `offset_g = sum_{i<g} vocab_i`, is added by the caller,
and the ids are flattened **group-major**: `ids[g*T + t] = code_g[t] + offset_g`, every
group with the same T. The in-graph sum is over the rows of the float embeddings (Reshape +
Reduction with an explicit axis; no int tensor is sliced, nothing enters ncnn's batch axis,
pnnx-bugs case 7). Ids must be in range: ncnn clamps an out-of-range id to the table, which
in a fused table is another group's row (`FusedManifest.pack_ids` checks).

Sum forms matched: a tree of two-input `BinaryOp` adds (`0=0`), `Eltwise` SUM (coefficients
absent or all 1), and the stack+sum forms: every term ends in a layer giving it extent 1 on
the stacked axis a (`ExpandDims(a)`, or a `Reshape` with a literal 1 there; pnnx's
`stack(parts, -1).sum(-1)`) + `Concat(a)` + `Reduction` SUM over a; or `Concat(0)` of the
terms + a `Reshape` making N the outermost dim + `Reduction` SUM over axis 0 (pnnx's
`stack(parts, 1).sum(1)`). Between each `Embed` and the sum there may be a chain of layout
layers (`Reshape`, `Permute`, `ExpandDims`, `Squeeze`, `Flatten`; pnnx puts
`Reshape 12=233 13=0` there) that is the same for every branch; it commutes with the sum and
is applied once after it. A stack along ncnn's batch axis (`Concat 0=-233`, pnnx-bugs case
4) is broken as exported: refused, `fix-reduction` turns it into an `Eltwise` first.

Biases (`2=1`) are folded into the table rows (the same float additions the unfused graph
makes), so the fused `Embed` has none. Tables stored fp16 stay fp16 (bytes concatenated
exactly) when every table is fp16 and none has a bias; otherwise the fused table is fp32
holding exactly the values ncnn loads. Every other layer keeps its weight bytes.

`split` mode is the form without the sum: the chosen `Embed`s become one `Embed` and a
`Slice` into N outputs that keep the original output names (each group's rows).
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from paramsurgery.core.ncnn import BinaryOpType, EltwiseOpType
from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.core.changes import Change
from paramsurgery.passes.base import Pass, PassResult
from paramsurgery.core.match import MatchFailure
from paramsurgery.patterns.match import chain_up
from paramsurgery.analysis.shape_expr import int_or_none, reshape_dims

from paramsurgery.formats.codebooks import CodebookGroup, FusedManifest, Fusion
from paramsurgery.analysis.shapes import infer_shapes

if TYPE_CHECKING:
    pass

LAYOUT_TYPES = ("Reshape", "Permute", "ExpandDims", "Squeeze", "Flatten")
# ============================================================================ matching

@dataclass
class _Branch:
    embed: Layer
    chain: list[Layer]  # layout layers from the Embed towards the sum, in order
    leaf_blob: str  # the blob the sum reads


@dataclass
class _SumMatch:
    root: Layer  # the layer writing the sum
    removed: list[Layer]  # the sum's own layers (adds / Eltwise / Concat+Reshape+Reduction)
    branches: list[_Branch]
    post: list[Layer]  # layout layers to apply once after the fused sum (templates)
    post_extra: list[tuple[str, Any]] = field(default_factory=list)  # new layers (type, params)


def _is_add(layer: Layer) -> bool:
    p = layer.params
    return (layer.type == "BinaryOp" and p.get(0, 0) == BinaryOpType.ADD and not p.get(1, 0)
            and len(layer.inputs) == 2 and len(layer.outputs) == 1)


def _params_text(layer: Layer) -> str:
    return " ".join(layer.params.tokens())


def _branch(g: Graph, blob: str, sum_layer: Layer) -> _Branch:
    """Walk up from a summed blob through single-reader layout layers to an Embed."""
    embed, chain = chain_up(g, blob, LAYOUT_TYPES, ("Embed",), reader=sum_layer,
                            what="summed term", goal="an Embed")
    chain.reverse()
    return _Branch(embed, chain, blob)


def _add_tree(g: Graph, root: Layer) -> tuple[list[Layer], list[str]]:
    """The adds of the tree rooted at `root` and its leaf blobs, left to right."""
    adds: list[Layer] = []
    leaves: list[str] = []
    stack: list[str | Layer] = [root]
    taken: set[int] = set()  # an add reading its own top (a cycle, PS105) is taken once
    while stack:
        item = stack.pop()
        if isinstance(item, Layer):
            if item.id in taken:
                continue
            taken.add(item.id)
            adds.append(item)
            for b in reversed(item.inputs):
                stack.append(b)
            continue
        p = g.producer(item)
        if p is not None and _is_add(p) and g.consumer_layers(item) == [_reader_of(g, item)] \
                and len(g.consumers(item)) == 1:
            stack.append(p)
        else:
            leaves.append(item)
    return adds, leaves


def _reader_of(g: Graph, blob: str) -> Layer:
    return g.consumers(blob)[0][0]


def _ints(v: Any) -> list[int] | None:
    if v is None:
        return None
    if isinstance(v, (list, tuple)):
        return [int(x) for x in v]
    return [int(v)]


def _dims_params(dims: list) -> dict:
    """Reshape params for dims given innermost first (w, h[, d], c)."""
    dims = [int(x) if int_or_none(str(x)) is not None else x for x in dims]
    keys = {1: (0,), 2: (0, 1), 3: (0, 1, 2), 4: (0, 1, 11, 2)}[len(dims)]
    return dict(zip(keys, dims))


class FuseCodebooks(Pass, name="fuse-codebooks",
                    summary="N Embeds (one id input each) whose rows are summed -> one Embed over the "
                            "concatenated tables, offsets added by the caller (or split outputs)"):
    mode: str = "sum"
    embeds: Sequence[str] | None = None  # or "a,b,c"
    input_name: str | None = None
    layer_name: str | None = None  # the fused Embed's name (`--name`)
    _: KW_ONLY
    inputshape: Mapping[str, tuple] | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("sum", "split"):
            raise PassRefused(f"unknown mode {self.mode!r} (sum or split)")
        embeds = self.embeds
        if isinstance(embeds, str):
            embeds = [e.strip() for e in embeds.split(",") if e.strip()]
        object.__setattr__(self, "embeds", tuple(embeds) if embeds else None)
        object.__setattr__(self, "inputshape", dict(self.inputshape or {}))

    # ------------------------------------------------------------------ sum matching
    def _match_sums(self, g: Graph, result: PassResult) -> list[_SumMatch]:
        matches: list[_SumMatch] = []
        taken: set[int] = set()
        for layer in list(g):
            if layer.id in taken:
                continue
            try:
                m = self._match_root(g, layer)
            except MatchFailure as exc:
                if self._mentions_embed(g, layer):
                    result.skipped.append(MatchFailure(layer.name, str(exc), line=layer.source_line))
                continue
            if m is None:
                continue
            if self.embeds is not None:
                names = {b.embed.name for b in m.branches}
                if not names & set(self.embeds):
                    continue
                if not names <= set(self.embeds):
                    result.skipped.append(MatchFailure(layer.name, f"sums Embeds "
                                               f"{', '.join(sorted(names - set(self.embeds)))} "
                                               f"that --embeds does not name", line=layer.source_line))
                    continue
            try:
                self._check_branches(g, m)
            except MatchFailure as exc:
                result.skipped.append(MatchFailure(layer.name, str(exc), line=layer.source_line))
                continue
            taken.update(x.id for x in m.removed)
            matches.append(m)
        return matches

    def _mentions_embed(self, g: Graph, layer: Layer) -> bool:
        """Whether a failed candidate is worth an --explain line (an Embed feeds it)."""
        from itertools import islice

        from paramsurgery.patterns.match import walk_up

        near = walk_up(g, layer.inputs, LAYOUT_TYPES + ("BinaryOp", "Concat", "Eltwise", "Split"))
        return any(p is not None and p.type == "Embed" for _, p in islice(near, 64))

    def _match_root(self, g: Graph, layer: Layer) -> _SumMatch | None:
        """A sum whose terms are Embed rows, written by `layer`; None if `layer` is not the
        top of a sum (or is an inner add)."""
        if _is_add(layer):
            out = layer.outputs[0]
            readers = g.consumers(out)
            if len(readers) == 1 and _is_add(readers[0][0]):
                return None  # an inner add: its root will take it
            adds, leaves = _add_tree(g, layer)
            if not any(self._leads_to_embed(g, b) for b in leaves):
                return None
            branches = [_branch(g, b, g.consumers(b)[0][0]) for b in leaves]
            return _SumMatch(layer, adds, branches, list(branches[0].chain))
        if layer.type == "Eltwise" and layer.params.get(0, 1) == EltwiseOpType.SUM:
            coeffs = layer.params.get(1)
            if not any(self._leads_to_embed(g, b) for b in layer.inputs):
                return None
            if isinstance(coeffs, list) and any(float(c) != 1.0 for c in coeffs):
                raise MatchFailure(layer, f"Eltwise SUM with coefficients {coeffs}: not a plain sum")
            if len(layer.inputs) < 2:
                return None
            branches = [_branch(g, b, layer) for b in layer.inputs]
            return _SumMatch(layer, [layer], branches, list(branches[0].chain))
        if layer.type == "Reduction":
            return self._match_stack(g, layer)
        return None

    def _leads_to_embed(self, g: Graph, blob: str) -> bool:
        try:
            chain_up(g, blob, LAYOUT_TYPES, ("Embed",), limit=32)
        except MatchFailure:
            return False
        return True

    def _match_stack(self, g: Graph, red: Layer) -> _SumMatch | None:
        p = red.params
        if p.get(0, 0) != 0:
            return None
        src = g.producer(red.inputs[0]) if red.inputs else None
        reshape = None
        if src is not None and src.type == "Reshape":
            reshape, src = src, g.producer(src.inputs[0])
        if src is None or src.type != "Concat":
            return None
        concat = src
        if not any(self._leads_to_embed(g, b) for b in concat.inputs):
            return None
        cat_axis = concat.params.get_int(0, 0)
        if cat_axis == -233:
            raise MatchFailure(concat, f"Concat {concat.name!r} stacks along the batch axis (pnnx-bugs case "
                          f"4: the graph is broken); run `paramsurgery fix-reduction` first")
        if p.get(1, 1) != 0:
            raise MatchFailure(red, f"Reduction {red.name!r} reduces everything (1=1), not the stacked axis")
        if p.get_float(2, 1.0) != 1.0:
            raise MatchFailure(red, f"Reduction {red.name!r} scales the sum by {p.get(2)}")
        axes = _ints(p.get(3))
        if not axes or len(axes) != 1:
            raise MatchFailure(red, f"Reduction {red.name!r} has axes {axes}: want exactly the stacked "
                          f"axis (an empty list reduces nothing, pnnx-bugs case 4)")
        axis = axes[0]
        keep = p.get_int(4, 0)
        for b in [concat.outputs[0]] + ([reshape.outputs[0]] if reshape else []):
            if len(g.consumers(b)) != 1:
                raise MatchFailure(None, f"the stacked blob {b!r} is also read elsewhere")
        n = len(concat.inputs)
        branches = [_branch(g, b, concat) for b in concat.inputs]
        if reshape is None:
            return self._match_unit_stack(g, concat, red, branches, cat_axis, axis, keep)
        # pnnx's stack(parts, k).sum(k) with k the parts' outermost axis: Concat(0) joins
        # the parts' memory blocks, a Reshape makes N the outermost dim, Reduction sums it
        dims = reshape_dims(reshape)
        if cat_axis != 0:
            raise MatchFailure(concat, f"Concat {concat.name!r} joins axis {cat_axis}, Reshape "
                          f"{reshape.name!r} then regroups: only a Concat along the outermost "
                          f"axis (0) keeps each term a contiguous block")
        if reshape.params.get(12, 233) != 233 or reshape.params.get(13, 233) != 233:
            raise MatchFailure(reshape, f"Reshape {reshape.name!r} moves an axis into ncnn's batch axis")
        if not dims or dims[-1] != str(n):
            raise MatchFailure(reshape, f"Reshape {reshape.name!r} ({dims}) does not make the N={n} stacked "
                          f"terms its outermost axis")
        if axis not in (0, -len(dims)) or keep:
            raise MatchFailure(red, f"Reduction {red.name!r} (axes {axes}, keepdims {keep}) does not sum "
                          f"the outermost (stacked) axis away")
        rest = dims[:-1]
        post = list(branches[0].chain)
        m = _SumMatch(red, [concat, reshape, red], branches, post)
        d = branches[0].embed.params.get_int(0, 0)
        identity = not post and len(rest) == 2 and rest[0] in (str(d), "0", "0w") and \
            rest[1] in ("-1", "0", "0h")
        if identity:
            return m  # the rows [d, T] already have the per-term shape
        if not all(int_or_none(t) is not None for t in rest) or sum(t == "-1" for t in rest) > 1:
            raise MatchFailure(reshape, f"Reshape {reshape.name!r} ({dims}): the per-term shape "
                          f"{rest} refers to the stacked blob's dims; it cannot be restated for "
                          f"one term")
        m.post_extra.append(("Reshape", _dims_params([int(t) for t in rest])))
        return m

    def _match_unit_stack(self, g: Graph, concat: Layer, red: Layer, branches: list[_Branch],
                          cat_axis: int, axis: int, keep: int) -> _SumMatch:
        """Every term ends in a layer giving it extent 1 on the Concat axis (ExpandDims of
        that axis, or a Reshape with a literal 1 there); Reduction sums that axis."""
        lasts = [br.chain[-1] if br.chain else None for br in branches]
        last0 = lasts[0]
        for br, last in zip(branches, lasts):
            if last is None or last0 is None or last.type not in ("ExpandDims", "Reshape") or \
                    (last.type, _params_text(last)) != (last0.type, _params_text(last0)):
                raise MatchFailure(concat, f"Concat {concat.name!r} + Reduction {red.name!r}: the terms do "
                              f"not all end in the same ExpandDims/Reshape giving them extent "
                              f"1 on the stacked axis ({br.embed.name!r})")
        assert last0 is not None  # the loop refused a branch without one
        if last0.type == "ExpandDims":
            # the stacked blob's rank (from the shape analysis) relates a negative Reduction
            # axis to the Concat axis
            # (the run's analysis: computed once per edit version, shared)
            known = infer_shapes(g, inputshape=self.inputshape).shape_of(concat.outputs[0])
            rank = len(known) if known is not None else None
            if _ints(last0.params.get(3)) != [cat_axis]:
                raise MatchFailure(last0, f"ExpandDims {last0.name!r} adds axis "
                              f"{_ints(last0.params.get(3))}, Concat {concat.name!r} stacks "
                              f"axis {cat_axis}")
            reduced = None
        else:
            dims = reshape_dims(last0)
            if not dims or last0.params.get(12, 233) != 233 or last0.params.get(13, 233) != 233:
                raise MatchFailure(last0, f"Reshape {last0.name!r}: shape unknown or batch axis moved")
            rank = len(dims)
            a = cat_axis + rank if cat_axis < 0 else cat_axis
            idx = rank - 1 - a  # dims are innermost first, axes outermost first
            if not 0 <= idx < rank or dims[idx] != "1":
                raise MatchFailure(last0, f"Reshape {last0.name!r} ({dims}) does not give the terms extent "
                              f"1 on the stacked axis {cat_axis}")
            rest = dims[:idx] + dims[idx + 1:]
            if not rest:
                raise MatchFailure(last0, f"Reshape {last0.name!r} makes each term a single element")
            reduced = ("Reshape", _dims_params(rest) if all(int_or_none(t) is not None for t in rest)
                       else {6: ",".join(rest)})
        norm = lambda x, r: x + r if (x < 0 and r) else x  # noqa: E731
        if axis != cat_axis and rank is None:
            raise MatchFailure(red, f"Reduction {red.name!r} reduces axis {axis}, Concat "
                               f"{concat.name!r} stacks axis {cat_axis}, and the rank of "
                               f"{concat.outputs[0]!r} is not known: give the id inputs' "
                               f"shapes (--inputshape NAME=[T])")
        if axis != cat_axis and norm(axis, rank) != norm(cat_axis, rank):
            raise MatchFailure(red, f"Reduction {red.name!r} reduces axis {axis}, Concat "
                               f"{concat.name!r} stacks axis {cat_axis}")
        removed = [concat, red] + [x for x in lasts if x is not None]
        for br in branches:
            br.chain = br.chain[:-1]
        m = _SumMatch(red, removed, branches, list(branches[0].chain))
        if keep:  # the reduced axis stays (size 1): the last layer as it was
            m.post_extra.append((last0.type, last0.params.copy()))
        elif reduced is not None:
            m.post_extra.append(reduced)
        return m

    def _check_branches(self, g: Graph, m: _SumMatch) -> None:
        if len(m.branches) < 2:
            raise MatchFailure(None, "fewer than 2 Embed terms")
        first = m.branches[0]
        sig = [(x.type, _params_text(x)) for x in first.chain]
        for br in m.branches[1:]:
            if [(x.type, _params_text(x)) for x in br.chain] != sig:
                raise MatchFailure(br.embed, f"the layout layers after {br.embed.name!r} differ from those "
                              f"after {first.embed.name!r}; the sum cannot be moved past them")
        self._check_embeds(g, [br.embed for br in m.branches])

    def _check_embeds(self, g: Graph, embeds: list[Layer]) -> None:
        seen_inputs: dict[str, str] = {}
        d = None
        for e in embeds:
            p = e.params
            if p.get(18, 0):
                raise MatchFailure(e, f"Embed {e.name!r} is int8 (18={p.get(18)}): not supported")
            num = p.get_int(0, 0)
            size = p.get_int(3, 0)
            if num <= 0 or size <= 0 or size % num:
                raise MatchFailure(e, f"Embed {e.name!r}: weight_data_size {size} is not a multiple of "
                              f"num_output {num}")
            if p.get(1) is not None and p.get_int(1) * num != size:
                raise MatchFailure(e, f"Embed {e.name!r}: input_dim {p.get(1)} x num_output {num} != "
                              f"weight_data_size {size}")
            if d is None:
                d = num
            elif num != d:
                raise MatchFailure(None, f"Embeds have different num_output ({embeds[0].name!r}: {d}, "
                              f"{e.name!r}: {num})")
            if len(e.inputs) != 1:
                raise MatchFailure(e, f"Embed {e.name!r} has {len(e.inputs)} bottoms")
            ids = e.inputs[0]
            src = g.producer(ids)
            if src is None or src.type != "Input":
                raise MatchFailure(e, f"the ids of Embed {e.name!r} ({ids!r}) are not a graph input "
                              f"(they come from {src.type + ' ' + repr(src.name) if src else 'nowhere'}"
                              f"); fuse-codebooks needs one id input per Embed")
            if ids in seen_inputs:
                raise MatchFailure(e, f"Embeds {seen_inputs[ids]!r} and {e.name!r} read the same ids "
                              f"{ids!r}")
            seen_inputs[ids] = e.name
            others = [r.name for r in g.consumer_layers(ids) if r is not e]
            if others:
                raise MatchFailure(e, f"the ids {ids!r} of Embed {e.name!r} are also read by "
                              f"{', '.join(others)}")
            if e.weights is not None and e.weights.get("weight") is None:
                raise MatchFailure(e, f"Embed {e.name!r} has no weight blob loaded")
        have = [e.weights is not None for e in embeds]
        if any(have) and not all(have):
            raise MatchFailure(None, "only some of the Embeds have weights loaded")

    # ------------------------------------------------------------------ split matching
    def _match_split(self, g: Graph, result: PassResult) -> list[Layer]:
        embeds = g.by_type("Embed")
        if self.embeds is not None:
            missing = [n for n in self.embeds if g.find(n) is None]
            if missing:
                raise PassRefused(f"--embeds names no layer: {', '.join(missing)}")
            chosen = [g.layer(n) for n in self.embeds]
            wrong = [l.name for l in chosen if l.type != "Embed"]
            if wrong:
                raise PassRefused(f"--embeds names layers that are not Embeds: {', '.join(wrong)}")
            chosen.sort(key=lambda l: g.position()[l.id])
        else:
            chosen = []
            for e in embeds:
                src = g.producer(e.inputs[0]) if e.inputs else None
                if src is None or src.type != "Input" or g.consumer_layers(e.inputs[0]) != [e]:
                    result.skipped.append(MatchFailure(e.name, "its ids are not a graph input of its own",
                                                       line=e.source_line))
                    continue
                chosen.append(e)
            dims = {e.params.get_int(0, 0) for e in chosen}
            if len(dims) > 1:
                raise PassRefused(f"Embeds with their own id input have different widths "
                                  f"({', '.join(map(str, sorted(dims)))}): name the group with "
                                  f"--embeds")
        if len(chosen) < 2:
            raise PassRefused("split mode needs at least 2 Embeds with their own id inputs")
        try:
            self._check_embeds(g, chosen)
        except MatchFailure as exc:
            raise PassRefused(str(exc)) from None
        return chosen

    # ------------------------------------------------------------------ run
    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        if not g.by_type("Embed"):
            raise PassRefused("the graph has no Embed layer")
        # the shape analysis, once per run before any edit (the matchers read it: cached per
        # edit version); a graph it cannot analyse is refused here, before matching
        infer_shapes(g, inputshape=self.inputshape)
        fusions: list[Fusion] = []
        if self.mode == "sum":
            matches = self._match_sums(g, result)
            if not matches:
                reasons = "; ".join(f"{s.layer}: {s.reason}" for s in result.skipped)
                raise PassRefused("no sum of Embed lookups to fuse" +
                                  (f" ({reasons})" if reasons else ""))
            for i, m in enumerate(matches):
                fusions.append(self._rewrite_sum(g, m, i, len(matches), result))
        else:
            chosen = self._match_split(g, result)
            fusions.append(self._rewrite_split(g, chosen, result))
        result.modified = True
        result.data["fusions"] = fusions
        result.data["manifest"] = FusedManifest(fusions)
        return result

    # ------------------------------------------------------------------ rewrites
    def _groups(self, embeds: list[Layer]) -> list[CodebookGroup]:
        groups, off = [], 0
        for i, e in enumerate(embeds):
            vocab = e.params.get_int(3) // e.params.get_int(0)
            groups.append(CodebookGroup(i, e.name, e.inputs[0], vocab, off,
                                        bool(e.params.get(2, 0))))
            off += vocab
        return groups

    def _fused_embed(self, g: Graph, embeds: list[Layer], groups: list[CodebookGroup],
                     ids: str, out: str, name: str, before: Layer) -> tuple[Layer, str]:
        d = embeds[0].params.get_int(0)
        total = sum(gr.vocab for gr in groups)
        fused = g.add_layer("Embed", name, [ids], [out],
                            {0: d, 1: total, 2: 0, 3: total * d}, before=before)
        dtype = "none"
        if embeds[0].weights is not None:
            tables = []
            fp16 = all(e.weights["weight"].dtype == "fp16" for e in embeds) and \
                not any(gr.bias for gr in groups)
            for e, gr in zip(embeds, groups):
                w = e.weights["weight"]
                t = w.array() if fp16 else w.float32()
                t = np.asarray(t).reshape(gr.vocab, d)
                if gr.bias:
                    b = e.weights["bias"].float32().reshape(1, d)
                    t = (t.astype(np.float32) + b).astype(np.float32)
                tables.append(t)
            table = np.concatenate(tables, axis=0)
            from paramsurgery.formats.weights import set_weights

            set_weights(fused, weight=table)
            dtype = "fp16" if fp16 else "fp32"
        return fused, dtype

    def _retire_inputs(self, g: Graph, groups: list[CodebookGroup], keep: str,
                       result: PassResult) -> list[str]:
        removed = []
        for gr in groups:
            if gr.input == keep:
                continue
            src = g.producer(gr.input)
            if src is None or g.consumers(gr.input):
                continue
            if len(src.outputs) == 1:
                g.remove_layer(src)
            else:
                g.set_outputs(src, [b for b in src.outputs if b != gr.input])
            removed.append(gr.input)
        if removed:
            result.changes.append(Change("Input", f"removed id inputs {', '.join(removed)} "
                                                  f"(now one group-major input {keep!r})"))
        return removed

    def _input_blob(self, g: Graph, first: str) -> str:
        if not self.input_name or self.input_name == first:
            return first
        if g.has_blob(self.input_name):
            raise PassRefused(f"--input-name {self.input_name!r}: a blob of that name exists")
        return self.input_name

    def _rewrite_sum(self, g: Graph, m: _SumMatch, index: int, count: int,
                     result: PassResult) -> Fusion:
        embeds = [br.embed for br in m.branches]
        order = g.position()
        embeds.sort(key=lambda e: order[e.id])
        groups = self._groups(embeds)
        n, d = len(groups), embeds[0].params.get_int(0)
        out = m.root.outputs[0]
        base = self.layer_name or "embed_fused"
        if count > 1:
            base = f"{base}_{index}"
        name = g.unique_layer_name(base)
        ids = groups[0].input
        rows = g.unique_blob_name(f"{name}_rows")
        fused, dtype = self._fused_embed(g, embeds, groups, ids, rows, name, before=m.root)
        grouped = g.unique_blob_name(f"{name}_groups")
        g.add_layer("Reshape", g.unique_layer_name(f"{name}_reshape"), [rows], [grouped],
                    {0: d, 1: -1, 2: n}, before=m.root)
        post = [(x.type, x.params.copy()) for x in m.post]
        post += [(t, p) for t, p in m.post_extra]
        # the old root lets go of the sum's name; the new chain writes it (readers unchanged)
        g.set_outputs(m.root, [g.unique_blob_name(f"{out}_unfused")])
        cur = g.unique_blob_name(f"{name}_sum") if post else out
        prev = g.add_layer("Reduction", g.unique_layer_name(f"{name}_sum"), [grouped], [cur],
                           {0: 0, 1: 0, 3: [0], 4: 0, 5: 1}, before=m.root)
        for i, (typ, params) in enumerate(post):
            nxt = out if i == len(post) - 1 else g.unique_blob_name(f"{name}_post{i}")
            prev = g.add_layer(typ, g.unique_layer_name(f"{name}_{typ.lower()}{i}"), [cur],
                               [nxt], params, after=prev)
            cur = nxt
        # remove the old sum, branches and embeds
        for x in list(m.removed) + [x for br in m.branches for x in br.chain] + embeds:
            g.remove_layer(x)
        removed_inputs, new_ids = self._finish_ids(g, groups, ids, result)
        result.changes.append(Change(name, f"{n} Embeds ({', '.join(e.name for e in embeds)}) "
                                           f"-> one Embed {sum(gr.vocab for gr in groups)}x{d}, "
                                           f"Reshape [{d}, T, {n}], Reduction SUM axis 0"
                                           + (f", then {' + '.join(t for t, _ in post)}"
                                              if post else "") + f" -> {out!r}"))
        result.changes.append(Change(m.root.name, f"sum of {n} lookups removed "
                                                  f"({len(m.removed)} layer(s))"))
        return Fusion(name, "sum", new_ids, d, groups, out, removed_inputs, dtype)

    def _finish_ids(self, g: Graph, groups: list[CodebookGroup], ids: str,
                    result: PassResult) -> tuple[list[str], str]:
        """Retire the other groups' id inputs and name the fused one: (removed, its name)."""
        removed_inputs = self._retire_inputs(g, groups, ids, result)
        new_ids = self._input_blob(g, ids)
        if new_ids != ids:
            g.rename_blob(ids, new_ids)
        return removed_inputs, new_ids

    def _rewrite_split(self, g: Graph, embeds: list[Layer], result: PassResult) -> Fusion:
        groups = self._groups(embeds)
        n, d = len(groups), embeds[0].params.get_int(0)
        name = g.unique_layer_name(self.layer_name or "embed_fused")
        ids = groups[0].input
        rows = g.unique_blob_name(f"{name}_rows")
        outs = [e.outputs[0] for e in embeds]
        for gr, o in zip(groups, outs):
            gr.output = o
        first = embeds[0]
        _fused, dtype = self._fused_embed(g, embeds, groups, ids, rows, name, before=first)
        for e in embeds:
            g.set_outputs(e, [g.unique_blob_name(f"{e.outputs[0]}_unfused")])
        g.add_layer("Slice", g.unique_layer_name(f"{name}_split"), [rows], outs,
                    {0: [-233] * n, 1: 0}, before=first)
        for e in embeds:
            g.remove_layer(e)
        removed_inputs, new_ids = self._finish_ids(g, groups, ids, result)
        result.changes.append(Change(name, f"{n} Embeds ({', '.join(e.name for e in embeds)}) "
                                           f"-> one Embed {sum(gr.vocab for gr in groups)}x{d} + "
                                           f"Slice into {n} (rows of each group, original names)"))
        return Fusion(name, "split", new_ids, d, groups, None, removed_inputs, dtype)
