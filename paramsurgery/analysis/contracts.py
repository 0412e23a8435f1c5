"""ncnn's run-time contracts of one layer: what its `forward` assumes about its params and
its bottom/top counts that its `load_param` does not check (ncnn loads the graph, then
reads past a vector or writes garbage at run time).

One knowledge base, read by everything that judges a layer: `validate(g)` (PS113, PS114,
hence `lint`), `set-param` and `insert` before they edit, `add-kvcache`'s matcher. A graph
built through the Python API is judged by the same table as one edited by a command.

- `arity_problem(layer)`: the bottom/top counts its params fix (SDPA and MultiHeadAttention
  `5=` attn_mask / `7=` kv_cache, BinaryOp `1=` with_scalar, Gemm `4=`/`5=` constant A/B,
  the fixed-count types) against the counts it has (ncnn 1.0.20261020 `src/layer/*.cpp`).
- `param_problem(layer)`: params that contradict each other (a Reshape inferring two dims,
  a Crop whose starts/ends arrays are shorter than its axes).
- `cache_tops(layer)`: the tops of a native kv cache (7=1), outputs the host reads back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from paramsurgery.core.findings import ERROR, Finding

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph
    from paramsurgery.ir.layer import Layer
    from paramsurgery.ir.params import Params

LAYER_ARITY = "PS113"
PARAM_CONSISTENCY = "PS114"

ATTENTION_TYPES = ("SDPA", "MultiHeadAttention")


def _int(params: "Params", pid: int, default: int = 0) -> int:
    v = params.get(pid, default)
    return v if isinstance(v, int) else default


# ------------------------------------------------------------------------------ arity

# (fewest bottoms, most bottoms, tops) as a function of the params; None = not fixed
Arity = tuple[int, int, int]


def _sdpa(p: "Params") -> Arity:
    # sdpa.cpp: q k v [attn_mask] [past_key past_value] -> out [key value]
    n = 3 + (1 if _int(p, 5) else 0) + (2 if _int(p, 7) else 0)
    return n, n, 3 if _int(p, 7) else 1


def _mha(p: "Params") -> Arity:
    # multiheadattention.cpp resolve_bottom_blob_index: q [k [v]] [attn_mask] [cache_k cache_v]
    extra = (1 if _int(p, 5) else 0) + (2 if _int(p, 7) else 0)
    return 1 + extra, 3 + extra, 3 if _int(p, 7) else 1


def _binaryop(p: "Params") -> Arity:
    n = 1 if _int(p, 1) else 2  # with_scalar: one operand and the scalar b
    return n, n, 1


def _gemm(p: "Params") -> Arity:
    # gemm.cpp: A unless constantA, B unless constantB, then an optional C unless constantC
    n = (0 if _int(p, 4) else 1) + (0 if _int(p, 5) else 1)
    return n, n + (0 if _int(p, 6) else 1), 1


def _fixed(n_in: int, n_out: int = 1) -> Callable[["Params"], Arity]:
    return lambda p: (n_in, n_in, n_out)


ARITY: dict[str, Callable[["Params"], Arity]] = {
    "SDPA": _sdpa,
    "MultiHeadAttention": _mha,
    "BinaryOp": _binaryop,
    "Gemm": _gemm,
    "MatMul": _fixed(2),
    "RotaryEmbed": _fixed(3),
    "GridSample": _fixed(2),
    "CopyTo": _fixed(2),
}


def arity(layer_type: str, params: "Params") -> Arity | None:
    """(fewest bottoms, most bottoms, tops) a layer of this type with these params has, or
    None when ncnn does not fix them."""
    fn = ARITY.get(layer_type)
    return fn(params) if fn is not None else None


def arity_problem(layer: "Layer") -> str | None:
    """None when the layer's bottom/top counts are the ones its params make its forward
    read and write, else what is wrong (ncnn's load_param does not check; forward reads
    past its vector of bottoms and crashes, or misreads one blob as another)."""
    want = arity(layer.type, layer.params)
    if want is None:
        return None
    lo, hi, n_top = want
    n_in, n_out = len(layer.inputs), len(layer.outputs)
    if lo <= n_in <= hi and n_out == n_top:
        return None
    p = layer.params
    if layer.type in ATTENTION_TYPES:
        mask, cache = _int(p, 5), _int(p, 7)
        what = f"{layer.type} with 5={mask} 7={cache}"
    elif layer.type == "BinaryOp":
        what = f"BinaryOp with 1={_int(p, 1)}"
    elif layer.type == "Gemm":
        what = f"Gemm with 4={_int(p, 4)} 5={_int(p, 5)} 6={_int(p, 6)}"
    else:
        what = layer.type
    bottoms = f"{lo}" if lo == hi else f"{lo} to {hi}"
    text = (f"{what} reads {bottoms} bottom{'s' if hi != 1 else ''} and writes {n_top} "
            f"top{'s' if n_top != 1 else ''}, but it has {n_in} and {n_out}")
    if layer.type in ATTENTION_TYPES and _int(p, 7) and n_out < 3:
        text += (" (7=1 needs the cache blobs: leave 7=0 and let paramsurgery add-kvcache "
                 "add both)")
    return text


# ------------------------------------------------------------------------------ params

RESHAPE_DIMS = {0: "w", 1: "h", 11: "d", 2: "c"}


def _ints(params: "Params", pid: int) -> list[int] | None:
    try:
        v = params.get_ints(pid)
    except (TypeError, ValueError, KeyError):
        return None
    return list(v) if v is not None else None


def param_problem(layer: "Layer") -> str | None:
    """None when the layer's params are consistent with each other, else the contradiction
    its forward trips over."""
    p = layer.params
    if layer.type == "Reshape" and p.get(6) in (None, ""):
        inferred = [f"{pid}({RESHAPE_DIMS[pid]})" for pid in RESHAPE_DIMS if p.get(pid) == -1]
        if len(inferred) > 1:
            return (f"Reshape infers {len(inferred)} dims (-1 in "
                    f"{', '.join(inferred)}): ncnn divides by the other -1 and computes a "
                    f"negative size; at most one dim can be -1")
    if layer.type == "Crop" and not p.get(19) and not p.get(20):
        starts, ends, axes = (_ints(p, pid) or [] for pid in (9, 10, 11))
        if starts or ends:
            need = len(axes) if axes else None
            short = [(name, len(arr)) for name, arr in (("starts (9)", starts), ("ends (10)", ends))
                     if (need is not None and len(arr) < need) or
                     (need is None and len(arr) != max(len(starts), len(ends)))]
            if short:
                detail = ", ".join(f"{name} has {n} element{'s' if n != 1 else ''}"
                                   for name, n in short)
                want = (f"{need} axes (11)" if need is not None else
                        "as many starts as ends")
                return (f"Crop: {detail}, but it crops {want}: ncnn reads past the end of "
                        f"the array")
    return None


# ------------------------------------------------------------------------------ caches

def cache_tops(layer: "Layer") -> list[str]:
    """The cache tops of an attention layer with ncnn's native kv cache (7=1): outputs the
    host reads back and feeds to the next step."""
    if layer.type in ATTENTION_TYPES and _int(layer.params, 7) and len(layer.outputs) >= 3:
        return list(layer.outputs[1:3])
    return []


# ------------------------------------------------------------------------------ graph

def contract_findings(g: "Graph") -> list[Finding]:
    """PS113/PS114 on every layer of the types the table knows (one pass over them)."""
    out: list[Finding] = []

    def add(code: str, layer: "Layer", msg: str) -> None:
        out.append(Finding(code, ERROR, msg, layer.name, layer.source_line, layer.source_file))

    for layer in g.by_type(*ARITY):
        why = arity_problem(layer)
        if why is not None:
            add(LAYER_ARITY, layer, f"layer {layer.name!r}: {why}: ncnn loads the graph and "
                                    f"crashes at run time")
    for layer in g.by_type("Reshape", "Crop"):
        why = param_problem(layer)
        if why is not None:
            add(PARAM_CONSISTENCY, layer, f"layer {layer.name!r}: {why}")
    return out
