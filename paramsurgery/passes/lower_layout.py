"""Lowering rules for data-movement leftovers: static slices, slice assignment, padding.

Composed into `lower`'s default rules (`paramsurgery.passes.lower.RULES`). Every rule here
only moves values (Crop, Concat, Squeeze, Padding): the result is bit-identical to torch.

- `Tensor.slice` with static starts/ends/steps (and `selects`, pnnx's fused `x[i]`):
  one Crop per sliced dim; a step > 1 becomes one Crop per kept element + Concat; selects
  are cropped to one element and squeezed. HF's interleaved M-RoPE
  (`freqs[dim, ..., 1:k:3]`) leaves exactly these.
- `Tensor.slice_copy` (`x[..., a:b:s] = src`): Concat of the untouched Crops of `x` and the
  Crops of `src`, in order along the dim.
- `F.pad`: constant / replicate / reflect padding of the last three dims becomes ncnn's
  `Padding` (4=0/1/2). Pads pnnx left as a computed bottom (`F.pad(x, (K-S, extra))` with
  `extra` from `x.shape[-1]` and `math.ceil`) are evaluated exactly with
  `int_affine`: a pad that is the same number at every length is lowered, one that depends
  on the length is refused (ncnn's Padding takes numbers).

Axes. ncnn drops pnnx's batch axis from a blob; rules address a torch dim `d` of a traced
shape `S` by a negative ncnn axis when every dim that may be that batch axis comes before
`d`, by the positive axis `d` when every such dim comes after it, and refuse otherwise.
The dims that may be the batch axis are those of traced size 1: pnnx feeds size-1 batches
and moves a real axis into ncnn's `n` only with an explicit `Reshape 12=/13=`
(pnnx-bugs.md case 7); in a graph holding such a Reshape only negative axes are used.
"""

from __future__ import annotations

from paramsurgery.core.match import MatchFailure
from paramsurgery.ir.graph import Graph
from paramsurgery.analysis.int_affine import Affine, NotAffine, ShapeArith
from paramsurgery.passes.lowering import Rule, Rules, Site, checked_dim, rule

_LAYOUT: list[Rule] = []
INT_MAX = 2**31 - 1  # pnnx's "no select" / "to the end"
TO_END = -233  # ncnn Crop: end of the axis

_batch_reshape_cache: dict[int, bool] = {}


def _has_batch_reshape(g: Graph) -> bool:
    key = id(g)
    if key not in _batch_reshape_cache:
        _batch_reshape_cache.clear()
        _batch_reshape_cache[key] = any(
            lay.params.get(12, 233) != 233 or lay.params.get(13, 233) != 233
            for lay in g.by_type("Reshape"))
    return _batch_reshape_cache[key]


def ncnn_axis(s: Site, dim: object, shape: tuple | None) -> int:
    """torch dim `dim` of a blob with traced `shape` → an ncnn axis (see the module doc)."""
    d, rank = checked_dim(dim, shape)
    assert shape is not None  # checked_dim declined otherwise
    ones = [i for i, n in enumerate(shape) if n == 1]
    if d in ones:
        raise MatchFailure.declined(f"dim {d} has traced size 1 and may be pnnx's batch axis (ncnn's n), "
                       f"which ncnn layers cannot address")
    if all(i < d for i in ones):
        if rank - d > 4:
            raise MatchFailure.declined(f"dim {d} of a rank-{rank} tensor: ncnn blobs have at most 4 dims")
        return d - rank
    if all(i > d for i in ones) and not _has_batch_reshape(s.g):
        return d
    raise MatchFailure.declined(f"dim {d} of traced shape {_shape_text(shape)}: pnnx's batch axis may sit "
                   f"before or after it, so its ncnn axis is not known")


def _shape_text(shape: tuple) -> str:
    return "(" + ",".join("?" if n is None else str(n) for n in shape) + ")"


def _crop(s: Site, x: str, axis: int, start: int, end: int) -> str:
    return s.emit("Crop", [x], {9: [start], 10: [end], 11: [axis]}, "crop")


def _bounds(start: object, end: object, size: int | None, what: str) -> tuple[int, int | None]:
    """Normalised [start, end) of a static slice; end None = to the end of a dynamic dim."""
    start = 0 if start is None else start
    if not isinstance(start, int) or (end is not None and not isinstance(end, int)):
        raise MatchFailure.declined(f"{what}: start={start!r} end={end!r} are not static ints")
    if end is None or end >= INT_MAX:
        end = size
    if start < 0 or (end is not None and end < 0):
        if size is None:
            raise MatchFailure.declined(f"{what}: a negative index on a dynamic dim")
        start = start + size if start < 0 else start
        end = end + size if end is not None and end < 0 else end
    if size is not None:
        assert end is not None  # a missing end became `size` above
        start, end = min(start, size), min(end, size)
    if end is not None and end < start:
        end = start
    return start, end


def _positions(start: int, end: int | None, step: int, what: str) -> range:
    if end is None:
        raise MatchFailure.declined(f"{what}: a step of {step} to the end of a dynamic dim has no static "
                       f"element list")
    return range(start, end, step)


# ============================================================================ the rules

# x[sel, ..., a:b:k] = Squeeze(Concat(Crop(x, [p, p+1)) for p in range(a, b, k)), Crop(sel))
@rule("Tensor.slice", doc="Crop per dim; step k: Concat of one-element Crops; select: Crop + "
      "Squeeze", into=_LAYOUT)
def tensor_slice(s: Site) -> str:
    if len(s.layer.inputs) != 1:
        raise MatchFailure.declined("a start or end is computed at run time (an extra bottom)")
    op = s.op()
    shape = s.shape(0)
    if "dims" in op.params:
        dims, starts, ends = op.param("dims"), op.param("starts"), op.param("ends")
        steps, selects = op.param("steps"), op.param("selects", None)
        if not (isinstance(dims, tuple) and isinstance(starts, tuple) and
                isinstance(ends, tuple) and isinstance(steps, tuple)):
            raise MatchFailure.declined(f"dims/starts/ends/steps are not static tuples ({op.params})")
        selects = selects if isinstance(selects, tuple) else (INT_MAX,) * len(dims)
    else:
        dims, starts, ends = (op.param("dim"),), (op.param("start", 0),), (op.param("end"),)
        steps, selects = (op.param("step", 1),), (op.param("select", INT_MAX),)
    x = s.input(0)
    squeeze: list[int] = []
    for d, st, en, sp, sel in zip(dims, starts, ends, steps, selects):
        axis = ncnn_axis(s, d, shape)
        assert shape is not None and isinstance(d, int)  # ncnn_axis declined otherwise
        size = shape[d]
        what = f"dim {d}"
        if sel != INT_MAX:
            idx = sel + size if isinstance(sel, int) and sel < 0 and size is not None else sel
            if not isinstance(idx, int) or idx < 0:
                raise MatchFailure.declined(f"{what}: select {sel!r} is not a static index")
            x = _crop(s, x, axis, idx, idx + 1)
            squeeze.append(axis)
            continue
        if not isinstance(sp, int) or sp < 1:
            raise MatchFailure.declined(f"{what}: step {sp!r} is not a positive int")
        start, end = _bounds(st, en, size, what)
        if sp == 1:
            if start == 0 and end == size:
                continue
            x = _crop(s, x, axis, start, TO_END if end is None else end)
            continue
        picks = [_crop(s, x, axis, p, p + 1) for p in _positions(start, end, sp, what)]
        if not picks:
            raise MatchFailure.declined(f"{what}: the slice is empty")
        x = picks[0] if len(picks) == 1 else s.emit("Concat", picks, {0: axis}, "concat")
    if squeeze:
        x = s.emit("Squeeze", [x], {3: squeeze}, "squeeze")
    if not s.steps:
        raise MatchFailure.declined("the slice keeps the whole tensor (nothing to lower)")
    return x


# x[..., a:b:k] = src  ->  Concat(x[..., :a], src[..., 0:1], x[..., a+1:a+k], src[..., 1:2], ...)
@rule("Tensor.slice_copy", doc="Concat of the kept Crops of self and the Crops of src",
      into=_LAYOUT)
def slice_copy(s: Site) -> str:
    op = s.op()
    if "self" not in op.arg_names or "src" not in op.arg_names:
        raise MatchFailure.declined("pnnx recorded no $self/$src operands")
    i_self = op.inputs.index(op.arg_names["self"])
    i_src = op.inputs.index(op.arg_names["src"])
    if "dim" not in op.params:
        raise MatchFailure.declined("a multi-dim slice assignment")
    shape, src_shape = s.shape(i_self), s.shape(i_src)
    dim = op.param("dim")
    axis = ncnn_axis(s, dim, shape)
    assert shape is not None and isinstance(dim, int)  # ncnn_axis declined otherwise
    d = dim % len(shape)
    step = op.param("step", 1)
    if not isinstance(step, int) or step < 1:
        raise MatchFailure.declined(f"step {step!r} is not a positive int")
    start, end = _bounds(op.param("start", 0), op.param("end"), shape[d], "the slice")
    if step == 1 and end is None:
        raise MatchFailure.declined("assigns to the end of a dynamic dim (the source extent is not static)")
    pos = list(_positions(start, end, step, "the slice"))
    assert end is not None  # _positions declined otherwise
    expect = list(shape)
    expect[d] = len(pos)
    if src_shape is None or len(src_shape) != len(shape) or any(
            a != b for i, (a, b) in enumerate(zip(src_shape, expect)) if i != d) \
            or src_shape[d] != len(pos):
        raise MatchFailure.declined(f"src {_shape_text(src_shape or ())} does not fill {len(pos)} positions "
                       f"of self {_shape_text(shape)} exactly (broadcasting assignment)")
    x, src = s.input(i_self), s.input(i_src)
    pieces: list[str] = []
    prev = 0
    if step == 1:
        if start > 0:
            pieces.append(_crop(s, x, axis, 0, start))
        pieces.append(src)
        prev = end
    else:
        for j, p in enumerate(pos):
            if p > prev:
                pieces.append(_crop(s, x, axis, prev, p))
            pieces.append(_crop(s, src, axis, j, j + 1))
            prev = p + 1
    if shape[d] is None or prev < shape[d]:
        pieces.append(_crop(s, x, axis, prev, TO_END))
    if len(pieces) == 1:
        raise MatchFailure.declined("src replaces the whole tensor")
    return s.emit("Concat", pieces, {0: axis}, "concat")


_PAD_TYPE = {"constant": 0, "replicate": 1, "reflect": 2}
_PAD_PARAMS = ((2, 3), (0, 1), (7, 8))  # (before, after) for the last, 2nd-last, 3rd-last dim


# F.pad(x, (l, r, t, b, f, k), mode) = Padding 2=l 3=r 0=t 1=b 7=f 8=k 4=type 5=value
@rule("F.pad", doc="Padding 4=0|1|2 (constant|replicate|reflect); computed pads evaluated "
      "exactly, lowered when the same at every length", into=_LAYOUT)
def pad(s: Site) -> str:
    op = s.op()
    mode = op.param("mode", "constant")
    if mode not in _PAD_TYPE:
        raise MatchFailure.declined(f"mode {mode!r} has no ncnn Padding type")
    if "pad" in op.params:
        pads = op.param("pad")
        if not isinstance(pads, tuple) or not all(isinstance(p, int) for p in pads):
            raise MatchFailure.declined(f"pad={pads!r} is not a tuple of ints")
        pads = list(pads)
    else:
        pads = _computed_pads(s)
    if len(pads) % 2 or len(pads) > 6:
        raise MatchFailure.declined(f"{len(pads)} pad values (ncnn pads at most the last 3 dims)")
    value = op.param("value", 0.0)
    value = 0.0 if value is None else value
    if mode != "constant" and value not in (0, 0.0):
        raise MatchFailure.declined(f"mode {mode} with value {value!r}")
    if not isinstance(value, (int, float)):
        raise MatchFailure.declined(f"value {value!r} is not a number")
    shape = s.shape(0)
    if shape is None:
        raise MatchFailure.declined("pnnx recorded no shape for the input")
    params: dict[int, object] = {4: _PAD_TYPE[mode], 5: float(value)}
    for k in range(len(pads) // 2):
        before, after = pads[2 * k], pads[2 * k + 1]
        if before < 0 or after < 0:
            raise MatchFailure.declined(f"negative pad ({before}, {after}) is a crop")
        if before == after == 0:
            continue
        ncnn_axis(s, -1 - k, shape)  # refuses a padded dim that may be the batch axis
        params[_PAD_PARAMS[k][0]] = before
        params[_PAD_PARAMS[k][1]] = after
    return s.emit("Padding", [s.input(0)], params, "padding")


def _computed_pads(s: Site) -> list[int]:
    if len(s.layer.inputs) != 2:
        raise MatchFailure.declined("pnnx recorded no pad= and the layer has no pad bottom")
    arith = ShapeArith(s.g, s.traced())
    try:
        value = arith.value(s.layer.inputs[1])
    except NotAffine as exc:
        raise MatchFailure.declined(f"the pad is not exact integer shape arithmetic: {exc}") from None
    forms = value if isinstance(value, list) else [value]
    pads = []
    for f in forms:
        if not isinstance(f, Affine) or not f.is_number or not f.integral:
            raise MatchFailure.declined(f"pad {f} depends on the input length: ncnn's Padding takes "
                           f"numbers (pad a constant instead, pnnx-bugs.md case 5)")
        pads.append(int(f.const))
    return pads


LAYOUT_RULES = Rules(_LAYOUT)
