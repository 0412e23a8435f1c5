"""`quantize-int8`: rewrite layers into ncnn's int8 form from a calibration table, as ncnn's
tools/quantize/ncnn2int8.cpp does (ncnn 1.0.20261020).

    Convolution c 1 1 x y 0=16 1=3 5=1 6=432            (fp32 weights)
    Convolution c 1 1 x y 0=16 1=3 5=1 6=432 8=2        int8 weights, weight_scales[16],
                                                        input_scale[1]
- Convolution / InnerProduct: `8=2`, int8 weights quantized per output channel,
  `weight_scales` (one per output) and `input_scale` (the bottom blob's, from calibration);
- ConvolutionDepthWise: `8=1`, one weight scale per group;
- Gemm with constant A and/or B: `18=2`, A transposed to `2=0` and quantized per row, B
  transposed to `3=1` with one scale (ncnn2int8's layout; activations are quantized at run
  time);
- Embed: `18=2`, the weights with one scale (weight-only);
- RNN / LSTM / GRU: `8=2`, the input-to-hidden and hidden-to-hidden weights quantized per
  gate row (`NAME_param_0`, `NAME_param_1`; ncnn quantizes the input and the hidden state at
  run time, per time step);
- MultiHeadAttention: `18=2`, q/k/v weights per row (`_param_0..2`), the output projection
  with one scale (`_param_3`);
- SDPA: `18=2`, no weights (ncnn quantizes q·k and the attention weights at run time).
Values are quantized as ncnn does (`float2int8`: v·scale rounded half away from zero, clamped
to ±127). The table is ncnn2table's text format (`NAME_param_0 s...` weight scales, `NAME s`
the layer's input scale): `Int8Table.read`/`write` read and write the files ncnn2table writes,
so a table from either tool drives either tool. Layers named in `keep`, layers without a
table entry and layers already int8 stay as they are. Then, as ncnn2int8, an int8
convolution feeding another directly requantizes into it (`8=102`/`101`, the next layer's
input scale as its output scale; `requantize=False` / `--no-requantize` leaves it out).
Nothing here runs ncnn: `paramsurgery quantize` calibrates, quantizes with this pass and
measures the result through ncnn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from paramsurgery.core.match import MatchFailure
from paramsurgery.core.changes import Change
from paramsurgery.core.errors import ParamSurgeryError, PassRefused
from paramsurgery.formats.weights import set_weights
from paramsurgery.ir.graph import Graph
from paramsurgery.passes.base import Pass, PassResult
from paramsurgery.passes.options import internal, option

if TYPE_CHECKING:

    from paramsurgery.ir.layer import Layer

# layer types with an activation scale from calibration (their bottom blob is measured)
ACTIVATION_TYPES = ("Convolution", "ConvolutionDepthWise", "InnerProduct")
# weight-only: activations quantized at run time (Gemm, the recurrent layers, attention) or
# none (Embed)
RECURRENT_TYPES = ("RNN", "LSTM", "GRU")
WEIGHT_ONLY_TYPES = ("Gemm", "Embed") + RECURRENT_TYPES + ("MultiHeadAttention", "SDPA")
INT8_TYPES = ACTIVATION_TYPES + WEIGHT_ONLY_TYPES


def _ip(params: object, pid: int, default: int) -> int:
    """An int param (the default when absent or not an int)."""
    value = params.get(pid, default)  # type: ignore[attr-defined]
    return value if isinstance(value, int) else default


def float2int8(values: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """ncnn's `float2int8(v * scale)`: float32 product, round half away from zero, ±127."""
    v = np.asarray(values, np.float32) * np.asarray(scale, np.float32)
    r = np.trunc(v + np.copysign(np.float32(0.5), v))
    return np.clip(r, -127, 127).astype(np.int8)


def _absmax_scale(values: np.ndarray, levels: float = 127.0) -> float:
    m = float(np.max(np.abs(values))) if values.size else 0.0
    return 1.0 if m == 0.0 else float(np.float32(levels) / np.float32(m))


def weight_scales(layer: "Layer") -> np.ndarray:
    """ncnn2table's weight scales for a Convolution / ConvolutionDepthWise / InnerProduct:
    127 / absmax per output channel (per group for depthwise); a 3x3 stride-1 dilation-1
    Convolution uses 31 / absmax (ncnn's int8 winograd F43 wants 6-bit weights). An
    all-zero channel gets 1 (ncnn2table would divide by zero)."""
    w = _weight(layer, "weight")
    p = layer.params
    if layer.type == "ConvolutionDepthWise":
        groups = w.reshape(_ip(p, 7, 1), -1)
        return np.array([_absmax_scale(g) for g in groups], np.float32)
    rows = w.reshape(_ip(p, 0, 0), -1)
    levels = 127.0
    if layer.type == "Convolution":
        kw = _ip(p, 1, 0)
        kh = _ip(p, 11, kw)
        dw = _ip(p, 2, 1)
        dh = _ip(p, 12, dw)
        sw = _ip(p, 3, 1)
        sh = _ip(p, 13, sw)
        if (kw, kh, dw, dh, sw, sh) == (3, 3, 1, 1, 1, 1):
            levels = 31.0
    return np.array([_absmax_scale(r, levels) for r in rows], np.float32)


def _weight(layer: "Layer", role: str) -> np.ndarray:
    if layer.weights is None or role not in layer.weights.roles:
        raise PassRefused(f"{layer.type} {layer.name!r}: its weights are not loaded; give --bin",
                          line=layer.source_line)
    return np.asarray(layer.weights[role].array(), np.float32)


@dataclass
class Int8Table:
    """ncnn2table's calibration table: weight scales (`NAME_param_0`; the recurrent layers and
    MultiHeadAttention have more weights: `NAME_param_1`, ... in `more_weights`) and input
    scales (`NAME`: the scale of the layer's bottom blob), by layer name."""

    weights: dict[str, np.ndarray] = field(default_factory=dict)
    inputs: dict[str, float] = field(default_factory=dict)
    more_weights: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def weight_set(self, name: str, count: int) -> list[np.ndarray] | None:
        """The layer's `count` weight scale sets `_param_0 .. _param_{count-1}`, None when the
        table does not hold all of them."""
        sets = ([self.weights[name]] if name in self.weights else []) + \
            self.more_weights.get(name, [])
        return sets[:count] if len(sets) >= count else None

    @classmethod
    def read(cls, path: str | Path) -> "Int8Table":
        table = cls()
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ParamSurgeryError(f"cannot read the table: {exc.strerror}", file=str(path)) \
                from None
        for n, line in enumerate(text.splitlines(), 1):
            parts = line.split()
            if not parts:
                continue
            try:
                values = [float(x) for x in parts[1:]]
            except ValueError:
                raise ParamSurgeryError(f"not a number in {line.strip()!r}", file=str(path),
                                        line=n) from None
            if not values:
                raise ParamSurgeryError(f"{parts[0]}: no scale", file=str(path), line=n)
            key = parts[0]
            if "_param_" in key:
                name, _, idx = key.rpartition("_param_")
                scales = np.array(values, np.float32)
                if idx == "0":
                    table.weights[name] = scales
                elif idx.isdigit() and int(idx) == len(table.more_weights.get(name, [])) + 1:
                    table.more_weights.setdefault(name, []).append(scales)
                else:
                    raise ParamSurgeryError(f"{key}: weight scales out of order (ncnn2table "
                                            f"writes {name}_param_0, _param_1, ... in turn)",
                                            file=str(path), line=n)
            else:
                table.inputs[key] = values[0]
        return table

    def format(self) -> str:
        """The table as ncnn2table writes it (`%f` numbers, a space after each)."""
        lines = [f"{name}_param_{i} " + "".join(f"{v:f} " for v in s)
                 for name, first in self.weights.items()
                 for i, s in enumerate([first] + self.more_weights.get(name, []))]
        lines += [f"{name} {s:f} " for name, s in self.inputs.items()]
        return "\n".join(lines) + "\n"


class QuantizeInt8(Pass, name="quantize-int8", tag="int8", needs_weights=True,
                   summary="int8 weights and scales from an ncnn2table-format table (Convolution, "
                           "ConvolutionDepthWise, InnerProduct; Gemm, Embed, RNN, LSTM, GRU, "
                           "MultiHeadAttention and SDPA weight-only), as ncnn2int8"):
    table: Int8Table = option(default=None, metavar="TABLE", required=True, load=Int8Table.read,
                              help="the calibration table (ncnn2table's format; `paramsurgery "
                                   "quantize --save-table` writes one)")
    keep: frozenset[str] = option(default=frozenset(), metavar="NAME", repeat=True,
                                  help="a layer to leave in fp32 (repeatable)")
    types: tuple[str, ...] = internal(default=INT8_TYPES)
    requantize: bool = option(default=True, negate=True,
                              help="do not fuse requantization between int8 convolutions")

    def __post_init__(self) -> None:
        object.__setattr__(self, "table", self.table or Int8Table())
        object.__setattr__(self, "keep", frozenset(self.keep))
        object.__setattr__(self, "types", tuple(self.types))

    def requires(self, g: Graph) -> None:
        unknown = sorted(n for n in self.keep if g.find(n) is None)
        if unknown:
            raise PassRefused(f"--keep names no layer of the graph: {', '.join(unknown)}")

    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        for layer in list(g):
            if layer.type not in self.types:
                continue
            why = self._skip_reason(layer)
            if why is not None:
                result.skipped.append(MatchFailure(layer.name, why, line=layer.source_line))
                continue
            what = _QUANTIZERS[layer.type](layer, self.table)
            result.changes.append(Change(layer.name, f"{layer.type} int8", "fp32", what,
                                         layer.source_line))
            result.modified = True
        result.data["int8_layers"] = [c.layer for c in result.changes]
        if self.requantize:
            _fuse_requantize(g, result)
        return result

    def _skip_reason(self, layer: "Layer") -> str | None:
        p = layer.params
        if layer.name in self.keep:
            return "kept in fp32 (--keep)"
        if layer.type in ACTIVATION_TYPES:
            if _ip(p, 8, 0):
                return "already int8"
            if layer.type != "InnerProduct" and _ip(p, 19, 0):
                return "dynamic weights (from an input): nothing to quantize"
            if layer.name not in self.table.inputs or layer.name not in self.table.weights:
                return "no scale in the table"
            return None
        if _ip(p, 8 if layer.type in RECURRENT_TYPES else 18, 0):
            return "already quantized"
        if layer.type == "Gemm" and not (_ip(p, 4, 0) or _ip(p, 5, 0)):
            return "no constant A or B: nothing to quantize"
        return None


def _set(layer: "Layer", updates: dict[str, object]) -> None:
    values = {w.role: w for w in layer.weights} if layer.weights is not None else {}
    values.update(updates)
    set_weights(layer, values)


def _conv_like(layer: "Layer", table: Int8Table) -> str:
    w = _weight(layer, "weight")
    ws = np.asarray(table.weights[layer.name], np.float32)
    term = 1 if layer.type == "ConvolutionDepthWise" else 2
    rows = w.reshape(ws.size, -1)
    q = float2int8(rows, ws[:, None]).reshape(-1)
    layer.set(8, term)
    _set(layer, {"weight": q, "weight_scales": ws,
                 "input_scale": np.array([table.inputs[layer.name]], np.float32)})
    return f"8={term}, {ws.size} weight scale(s), input scale {table.inputs[layer.name]:g}"


def _fuse_requantize(g: Graph, result: PassResult) -> None:
    """ncnn2int8's `fuse_requantize`: an int8 Convolution/ConvolutionDepthWise whose top is
    the only bottom of a later int8 one gives int8 out (`8=10x`, output scale = the next
    layer's input scale), read by that layer without a dequantize/quantize round trip."""
    convs = ("Convolution", "ConvolutionDepthWise")
    order = list(g)
    for i, layer in enumerate(order):
        if layer.type not in convs or not layer.outputs:
            continue
        top = layer.outputs[0]
        nxt = next((x for x in order[i + 1:] if x.type in convs and len(x.inputs) == 1
                    and x.inputs[0] == top), None)
        if nxt is None or not (_is_int8(layer) and _is_int8(nxt)):
            continue
        term = _ip(layer.params, 8, 0)
        if term > 100:
            continue
        layer.set(8, term + 100)
        scale = np.asarray(nxt.weights["input_scale"].array(), np.float32).copy()
        _set(layer, {"output_scale": scale})
        result.changes.append(Change(layer.name, f"requantize into {nxt.name}", f"8={term}",
                                     f"8={term + 100}", layer.source_line))


def _is_int8(layer: "Layer") -> bool:
    return bool(_ip(layer.params, 8, 0)) and layer.weights is not None and \
        layer.weights["weight"].dtype == "int8"


def _gemm(layer: "Layer", table: Int8Table) -> str:
    p = layer.params
    m, n, k = (_ip(p, i, 0) for i in (7, 8, 9))
    updates: dict[str, object] = {}
    said = []
    if _ip(p, 4, 0):
        a = _weight(layer, "A")
        a = (a.reshape(k, m).T if _ip(p, 2, 0) else a.reshape(m, k))  # → (M, K)
        scales = np.array([_absmax_scale(row) for row in a], np.float32)
        layer.set(2, 0)
        updates["A"] = float2int8(a, scales[:, None]).reshape(-1)
        updates["A_scales"] = scales
        said.append(f"A {m}x{k} per row")
    if _ip(p, 5, 0):
        b = _weight(layer, "B")
        b = (b.reshape(n, k) if _ip(p, 3, 0) else b.reshape(k, n).T)  # → (N, K)
        scale = _absmax_scale(b)
        layer.set(3, 1)
        updates["B"] = float2int8(b, scale).reshape(-1)
        updates["B_scale"] = np.array([scale], np.float32)
        said.append(f"B {n}x{k} scale {scale:g}")
    layer.set(18, 2)
    _set(layer, updates)
    return "18=2, " + ", ".join(said)


def _embed(layer: "Layer", table: Int8Table) -> str:
    w = _weight(layer, "weight")
    scale = _absmax_scale(w)
    layer.set(18, 2)
    _set(layer, {"weight": float2int8(w, scale), "weight_scale": np.array([scale], np.float32)})
    return f"18=2, weight scale {scale:g}"


def _rows_scales(rows: np.ndarray) -> np.ndarray:
    return np.array([_absmax_scale(r) for r in rows], np.float32)


# a recurrent layer's gate rows per direction: RNN 1, LSTM 4 × hidden, GRU 3 × num_output
_GATES = {"RNN": 1, "LSTM": 4, "GRU": 3}


def recurrent_weight_scales(layer: "Layer") -> list[np.ndarray]:
    """ncnn2table's scales for an RNN / LSTM / GRU: 127 / absmax of every gate row of the
    input-to-hidden (`_param_0`) and hidden-to-hidden (`_param_1`) weights, direction by
    direction."""
    p = layer.params
    per_gate = _ip(p, 3, _ip(p, 0, 0)) if layer.type == "LSTM" else _ip(p, 0, 0)
    rows = _GATES[layer.type] * per_gate * (2 if _ip(p, 2, 0) == 2 else 1)
    return [_rows_scales(_weight(layer, role).reshape(rows, -1))
            for role in ("weight_xc", "weight_hc")]


def attention_weight_scales(layer: "Layer") -> list[np.ndarray]:
    """ncnn2table's scales for a MultiHeadAttention: q/k/v weights per row (embed_dim rows),
    the output projection with one scale."""
    embed = _ip(layer.params, 0, 0)
    qkv = [_rows_scales(_weight(layer, f"{x}_weight").reshape(embed, -1)) for x in "qkv"]
    return qkv + [np.array([_absmax_scale(_weight(layer, "out_weight"))], np.float32)]


def _from_table(layer: "Layer", table: Int8Table, count: int,
                computed: Callable[["Layer"], list[np.ndarray]]) -> list[np.ndarray]:
    """The table's weight scales for `layer` when it holds them (a table from ncnn2table
    drives the same bytes as ncnn2int8), else ncnn2table's own computation."""
    return table.weight_set(layer.name, count) or computed(layer)


def _recurrent(layer: "Layer", table: Int8Table) -> str:
    xc_s, hc_s = _from_table(layer, table, 2, recurrent_weight_scales)
    xc, hc = _weight(layer, "weight_xc"), _weight(layer, "weight_hc")
    layer.set(8, 2)
    _set(layer, {"weight_xc": float2int8(xc.reshape(xc_s.size, -1), xc_s[:, None]).reshape(-1),
                 "weight_hc": float2int8(hc.reshape(hc_s.size, -1), hc_s[:, None]).reshape(-1),
                 "weight_xc_scales": xc_s, "weight_hc_scales": hc_s})
    return f"8=2, {xc_s.size} + {hc_s.size} gate row scale(s)"


def _attention(layer: "Layer", table: Int8Table) -> str:
    scales = _from_table(layer, table, 4, attention_weight_scales)
    updates: dict[str, object] = {}
    for x, s in zip("qkv", scales):
        w = _weight(layer, f"{x}_weight")
        updates[f"{x}_weight"] = float2int8(w.reshape(s.size, -1), s[:, None]).reshape(-1)
        updates[f"{x}_scales"] = s
    updates["out_weight"] = float2int8(_weight(layer, "out_weight"), scales[3][0])
    updates["out_scale"] = scales[3][:1]
    layer.set(18, 2)
    _set(layer, updates)
    return f"18=2, q/k/v {scales[0].size} row scale(s) each, out scale {scales[3][0]:g}"


def _sdpa(layer: "Layer", table: Int8Table) -> str:
    layer.set(18, 2)
    return "18=2 (q, k and the attention weights quantized by ncnn at run time)"


_QUANTIZERS = {"Convolution": _conv_like, "ConvolutionDepthWise": _conv_like,
               "InnerProduct": _conv_like, "Gemm": _gemm, "Embed": _embed,
               "RNN": _recurrent, "LSTM": _recurrent, "GRU": _recurrent,
               "MultiHeadAttention": _attention, "SDPA": _sdpa}


def kl_threshold(hist: np.ndarray, target_bin: int = 128, chunk: int = 128) -> int:
    """ncnn2table's KL search (`quantize_KL`): the histogram bin count t ≥ `target_bin`
    whose clipped distribution is closest (KL divergence) to its `target_bin`-level
    quantization. ncnn's loops, in closed form over all t at once: with C the cumulative
    (piecewise-linear) histogram, level j of t holds C((j+1)·t/128) - C(j·t/128) spread
    evenly over its interval, so the expanded distribution at bin k is Q(k+1) - Q(k) with
    Q(x) = C(J·w) + (x/w - J)·(C((J+1)·w) - C(J·w)), w = t/128, J = ⌊x/w⌋."""
    bins = hist.size
    total = float(hist.sum())
    normed = hist / total if total > 0 else np.zeros(bins)
    cum = np.concatenate([[0.0], np.cumsum(normed)])
    kl_eps = 0.0001

    def c_of(x: np.ndarray) -> np.ndarray:
        fl = np.minimum(np.floor(x).astype(np.int64), bins - 1)
        return cum[fl] + (x - fl) * normed[fl]

    tail = np.concatenate([np.cumsum(normed[::-1])[::-1], [0.0]])  # tail[t] = Σ normed[t:]
    best, best_t = math.inf, target_bin
    ks = np.arange(bins + 1, dtype=np.float64)
    for lo in range(target_bin, bins, chunk):
        ts = np.arange(lo, min(lo + chunk, bins), dtype=np.float64)[:, None]
        w = ts / target_bin
        x = np.minimum(ks[None, :], ts)  # Q is flat past t (masked below anyway)
        xw = x / w
        big_j = np.minimum(np.floor(xw), target_bin - 1).astype(np.int64)
        levels = c_of(np.arange(target_bin + 1)[None, :] * w)  # C at each level's edge
        lo_c = np.take_along_axis(levels, big_j, axis=1)
        hi_c = np.take_along_axis(levels, big_j + 1, axis=1)
        q_at = lo_c + (xw - big_j) * (hi_c - lo_c)
        expand = np.diff(q_at, axis=1) + kl_eps
        valid = ks[None, :-1] < ts
        clip = kl_eps + np.where(valid, normed[None, :], 0.0)
        last = (ts[:, 0] - 1).astype(np.int64)
        rows = np.arange(ts.shape[0])
        clip[rows, last] += tail[last + 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(valid, clip * np.log(clip / expand), 0.0)
        kl = terms.sum(axis=1)
        i = int(np.argmin(kl))
        if kl[i] < best:
            best, best_t = float(kl[i]), int(ts[i, 0])
    return best_t


def _kl_threshold_loop(hist: np.ndarray, target_bin: int = 128) -> int:
    """ncnn2table's loops transcribed one threshold at a time (the reference for
    `kl_threshold` in the tests)."""
    bins = hist.size
    normed = hist / float(hist.sum())
    kl_eps = 0.0001
    best, best_t = math.inf, target_bin
    for t in range(target_bin, bins):
        clip = np.full(t, kl_eps) + normed[:t]
        clip[t - 1] += normed[t:].sum()
        npb = t / target_bin
        qd = np.zeros(target_bin)
        for j in range(target_bin):
            start, end = j * npb, (j + 1) * npb if j < target_bin - 1 else float(t)
            left_upper, right_lower = math.ceil(start), math.floor(end)
            left_scale, right_scale = left_upper - start, end - right_lower
            acc = normed[left_upper:right_lower].sum()
            if left_scale > 0:
                acc += left_scale * normed[left_upper - 1]
            if right_scale > 0 and right_lower < bins:
                acc += right_scale * normed[right_lower]
            qd[j] = acc / (end - start)
        expand = np.full(t, kl_eps)
        for j in range(target_bin):
            start, end = j * npb, (j + 1) * npb if j < target_bin - 1 else float(t)
            left_upper, right_lower = math.ceil(start), math.floor(end)
            left_scale, right_scale = left_upper - start, end - right_lower
            expand[left_upper:right_lower] += qd[j]
            if left_scale > 0:
                expand[left_upper - 1] += left_scale * qd[j]
            if right_scale > 0 and right_lower < t:
                expand[right_lower] += right_scale * qd[j]
        kl = float(np.sum(clip * np.log(clip / expand)))
        if kl < best:
            best, best_t = kl, t
    return best_t


def table_weight_sets(layer: "Layer") -> list[np.ndarray] | None:
    """What ncnn2table writes for a weight-only layer with several weights (`_param_0`, ...):
    the recurrent layers and MultiHeadAttention (not yet quantized); None for the others."""
    if _ip(layer.params, 8 if layer.type in RECURRENT_TYPES else 18, 0):
        return None
    if layer.type in RECURRENT_TYPES:
        return recurrent_weight_scales(layer)
    if layer.type == "MultiHeadAttention":
        return attention_weight_scales(layer)
    return None
