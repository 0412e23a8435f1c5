"""Binary `.param.bin` (ncnn2mem output, `Net::load_param_bin`) reader and writer.

Layout (ncnn-format.md §2; src/net.cpp load_param_bin, src/paramdict.cpp load_param_bin,
tools/ncnn2mem.cpp), little-endian int32 throughout::

    magic 7767517, layer_count, blob_count
    per layer: typeindex, bottom_count, top_count, bottom indexes, top indexes,
               params: id, value ... until id == -233
        id <= -23400: string  (idx = -id-23400): len, len bytes zero-padded to 4
        id <= -23300: array   (idx = -id-23300): len, len raw 4-byte elements
        else        : scalar, 4 raw bytes (int or float bits; untyped)

The file stores no names and no int/float distinction. Reading types each value by what
the layer's `load_param` reads (`layer_params`), or by a bit-pattern heuristic for ids no
table knows, and keeps every layer's raw param bytes: an unedited graph is written back
byte for byte; an edited layer re-encodes its typed values exactly. Names come from the
matching text `.param` (same structure) or ncnn2mem's `.id.h`, else are generated
(`<type>_<i>` layers, blob index as blob name).

Writing a text-loaded graph does what ncnn2mem does: types by layer_types order (custom
types `CustomBit | j` in order of first appearance), tops numbered in order, params in
file order with each token encoded as ncnn2mem encodes it (its `vstr_to_float`, `%d`),
strings as `-23400-id`, arrays (old or new style) as `-23300-id`, the header's blob count.
"""

from __future__ import annotations

import math
import os
import re
import struct
from pathlib import Path

import numpy as np

from paramsurgery.core.errors import ParamSyntaxError
from paramsurgery.ir.graph import Graph, Source
from paramsurgery.ir.layer import Layer
from paramsurgery.core.layer_params import param_kind
from paramsurgery.core.layer_types import NCNN_LAYER_TYPES, TYPE_INDEX
from paramsurgery.ir.params import Params
from paramsurgery.formats.param_text import TextOrigin
from paramsurgery.core.values import LONG_ARRAY, Kind, Packed, Value, format_value, is_mixed

MAGIC = 7767517
EOP = -233
CUSTOM_BIT = 1 << 8
_I32 = struct.Struct("<i")
_F32 = struct.Struct("<f")


# =========================================================================== reading

class _Cursor:
    def __init__(self, data: bytes, path: str | None) -> None:
        self.data = data
        self.pos = 0
        self.path = path

    def i32(self, what: str, layer: int | None = None) -> int:
        if self.pos + 4 > len(self.data):
            where = f" of layer #{layer}" if layer is not None else ""
            raise ParamSyntaxError(f"file ends at byte {len(self.data)} while reading {what}"
                                   f"{where} (byte {self.pos})", file=self.path)
        v = _I32.unpack_from(self.data, self.pos)[0]
        self.pos += 4
        return v

    def take(self, n: int, what: str, layer: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ParamSyntaxError(f"file ends at byte {len(self.data)} while reading {what} "
                                   f"of layer #{layer} ({n} bytes at byte {self.pos})",
                                   file=self.path)
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b


def _is_small_int(bits: int) -> bool:
    return -(1 << 24) < bits < (1 << 24)


def _float_ok(bits: int) -> bool:
    return math.isfinite(_F32.unpack(_I32.pack(bits))[0])


def _scalar_value(kind: Kind | None, bits: int) -> Value:
    """Type 4 raw bytes: as the layer reads them; unknown ids: small ints stay ints, other
    bit patterns that are finite floats become floats. Non-finite floats stay int bits (no
    text form exists for them)."""
    as_float = kind is Kind.FLOAT or (kind is None and not _is_small_int(bits))
    if as_float and _float_ok(bits):
        return Value(Kind.FLOAT, float(_F32.unpack(_I32.pack(bits))[0]))
    return Value(Kind.INT, bits)


def _array_value(kind: Kind | None, elems: tuple[int, ...]) -> Value:
    want_float = kind is Kind.FLOATS or (
        kind is None and elems and not all(_is_small_int(b) for b in elems))
    if want_float and all(_float_ok(b) for b in elems):
        return Value(Kind.FLOATS, tuple(float(x) for x in
                                        np.array(elems, dtype="<i4").view("<f4")))
    return Value(Kind.INTS, elems)


def _packed_array_value(kind: Kind | None, raw: bytes) -> Value:
    """`_array_value` for a long array, vectorised and kept as its 4-byte elements."""
    bits = np.frombuffer(raw, dtype="<i4").astype(np.int32)
    want_float = kind is Kind.FLOATS or (
        kind is None and bool(bits.size) and
        not bool(((bits > -(1 << 24)) & (bits < (1 << 24))).all()))
    if want_float and bool(np.isfinite(bits.view(np.float32)).all()):
        return Packed(Kind.FLOATS, bits)
    return Packed(Kind.INTS, bits)


def _decode_params(cur: _Cursor, layer_type: str,
                   index: int) -> tuple[list[tuple[int, Value]], bytes]:
    start = cur.pos
    out: list[tuple[int, Value]] = []
    pid = cur.i32("a param id", index)
    while pid != EOP:
        at = cur.pos - 4
        if pid <= -23400:
            idx = -pid - 23400
            kind = "string"
        elif pid <= -23300:
            idx = -pid - 23300
            kind = "array"
        else:
            idx = pid
            kind = "scalar"
        if not 0 <= idx < 32:
            raise ParamSyntaxError(f"layer #{index} ({layer_type}): param id {pid} at byte {at} "
                                   f"is out of range (ncnn: 'id < NCNN_MAX_PARAM_COUNT "
                                   f"failed')", file=cur.path)
        if kind == "string":
            n = cur.i32("a string length", index)
            if not 0 <= n <= 255:
                raise ParamSyntaxError(f"layer #{index} ({layer_type}): string param {idx} "
                                       f"length {n} at byte {cur.pos - 4} (ncnn allows 0..255)",
                                       file=cur.path)
            raw = cur.take((n + 3) // 4 * 4, "a string", index)[:n]
            s = raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if '"' in s or "\n" in s or "\r" in s:
                raise ParamSyntaxError(f"layer #{index} ({layer_type}): string param {idx} "
                                       f"contains a quote or newline; no text form exists",
                                       file=cur.path)
            out.append((idx, Value(Kind.STRING, s, True)))
        elif kind == "array":
            n = cur.i32("an array length", index)
            if n < 0:
                raise ParamSyntaxError(f"layer #{index} ({layer_type}): array param {idx} has "
                                       f"length {n} at byte {cur.pos - 4}", file=cur.path)
            raw = cur.take(4 * n, "array elements", index)
            want = _want(layer_type, idx, True)
            if n > LONG_ARRAY:
                out.append((idx, _packed_array_value(want, raw)))
            else:
                out.append((idx, _array_value(want, struct.unpack(f"<{n}i", raw))))
        else:
            bits = cur.i32("a param value", index)
            out.append((idx, _scalar_value(_want(layer_type, idx, False), bits)))
        pid = cur.i32("a param id or the end marker -233", index)
    return out, cur.data[start:cur.pos]


def _want(layer_type: str, pid: int, array: bool) -> Kind | None:
    k = param_kind(layer_type, pid)
    if k is None:
        return None
    if array:
        return k if k.is_array else None
    return k if k in (Kind.INT, Kind.FLOAT) else None


def read_param_bin(data: bytes, path: str | None = None, *,
                   names: str | os.PathLike | None = None) -> Graph:
    """Parse `.param.bin` bytes. Names come from `names` (a text `.param` or an `.id.h`),
    else from `x.param` / `x.id.h` next to `x.param.bin` when their structure matches."""
    from paramsurgery.core.collector import paused_gc

    cur = _Cursor(data, path)
    magic = cur.i32("the magic number")
    if magic != MAGIC:
        raise ParamSyntaxError(f"bad magic {magic}: expected 7767517", file=path)
    layer_count = cur.i32("layer_count")
    blob_count = cur.i32("blob_count")
    if layer_count <= 0 or blob_count <= 0:
        raise ParamSyntaxError(f"layer_count {layer_count} / blob_count {blob_count} must be "
                               f"> 0 (ncnn: 'invalid layer_count or blob_count')", file=path)
    records = []
    with paused_gc():
        for i in range(layer_count):
            rec_start = cur.pos
            typeindex = cur.i32("a type index", i)
            nb = cur.i32("bottom_count", i)
            nt = cur.i32("top_count", i)
            if nb < 0 or nt < 0 or nb > 65536 or nt > 65536:
                raise ParamSyntaxError(f"layer #{i}: bad blob counts {nb} {nt} at byte "
                                       f"{cur.pos - 8}", file=path)
            bottoms = [cur.i32("a bottom index", i) for _ in range(nb)]
            tops = [cur.i32("a top index", i) for _ in range(nt)]
            if typeindex & CUSTOM_BIT:
                type_name = f"Custom{typeindex & ~CUSTOM_BIT}"
            elif 0 <= typeindex < len(NCNN_LAYER_TYPES):
                type_name = NCNN_LAYER_TYPES[typeindex]
            else:
                raise ParamSyntaxError(f"layer #{i}: unknown type index {typeindex} at byte "
                                       f"{rec_start}", file=path)
            for b in bottoms + tops:
                if not 0 <= b < blob_count:
                    raise ParamSyntaxError(f"layer #{i} ({type_name}): blob index {b} outside "
                                           f"0..{blob_count - 1} (record at byte {rec_start})",
                                           file=path)
            params, raw = _decode_params(cur, type_name, i)
            records.append((rec_start, typeindex, type_name, bottoms, tops, params, raw))
    trailer = data[cur.pos:]

    layer_names = [f"{r[2].lower()}_{i}" for i, r in enumerate(records)]
    blob_names = {b: str(b) for r in records for b in r[3] + r[4]}
    type_names = [r[2] for r in records]
    restored = _restore_names(path, names, records, layer_names, blob_names, type_names)

    layers = []
    for i, (rec_start, typeindex, _t, bottoms, tops, params, raw) in enumerate(records):
        type_name = type_names[i]
        layer = Layer(type_name, layer_names[i], [blob_names[b] for b in bottoms],
                      [blob_names[b] for b in tops], None)
        if any(isinstance(v, Packed) for _, v in params) and \
                len({pid for pid, _ in params}) == len(params):
            # a long array: its typed values as they are, not through text and back
            p = Params.of_values(params, layer)
        else:
            text = " " + " ".join(format_value(pid, v) for pid, v in params) if params else ""
            p = Params(text, layer)
            p.check()
            p.forget_tokens()  # typed values: re-encode bits, not text, on edit
        layer.params = p
        layer.source_file = path
        layer.meta["param_bin_offset"] = rec_start
        layer.meta["param_bin_index"] = i
        layer.meta["param_bin_type"] = typeindex
        layer.meta["param_bin_params"] = raw
        layer.meta["param_bin_blobs"] = (tuple(bottoms), tuple(tops))
        layers.append(layer)
    g = Graph._from_layers(layers)
    for layer in layers:
        layer.origin = TextOrigin(layer.render(), "\n")
    g.source = Source(path=path, format="param.bin", header=b"", declared_layers=layer_count,
                      declared_blobs=blob_count, trailer=b"",
                      extra={"param_bin_header": data[:12], "param_bin_trailer": trailer,
                             "names_from": restored})
    return g


# --------------------------------------------------------------------------- names

_IDH_RE = re.compile(r"const int (LAYER|BLOB|TYPEINDEX)_(\S+) = (-?\d+);(?:[ \t]*// (\S+))?")


def _restore_names(path, names, records, layer_names, blob_names,
                   type_names) -> str | None:
    candidates: list[str] = []
    if names is not None:
        candidates.append(os.fspath(names))
    elif path and path.endswith(".param.bin"):
        base = path[:-len(".param.bin")]
        candidates += [base + ".param", base + ".id.h"]
    for cand in candidates:
        if not os.path.isfile(cand):
            if names is not None:
                raise ParamSyntaxError("names file not found", file=cand)
            continue
        ok = (_names_from_idh(cand, records, layer_names, blob_names, type_names)
              if cand.endswith(".h") else
              _names_from_param(cand, records, layer_names, blob_names, type_names))
        if ok:
            return cand
        if names is not None:
            raise ParamSyntaxError("its layers do not match the .param.bin (types, counts or "
                                   "blob indexes differ)", file=cand)
    return None


def _names_from_param(cand, records, layer_names, blob_names, type_names) -> bool:
    from paramsurgery.formats.param_text import read_param

    data = Path(cand).read_bytes()
    if data[:4] == b"\xdd\x85\x76\x00":
        return False
    try:
        text = read_param(data, cand)
    except ParamSyntaxError:
        return False
    tl = text.layers
    if len(tl) != len(records):
        return False
    ln: dict[int, str] = {}
    bn: dict[int, str] = {}
    custom: dict[int, str] = {}
    for i, (layer, rec) in enumerate(zip(tl, records)):
        _s, typeindex, type_name, bottoms, tops, _p, _r = rec
        if typeindex & CUSTOM_BIT:
            prev = custom.setdefault(typeindex, layer.type)
            if prev != layer.type or layer.type in TYPE_INDEX:
                return False
        elif layer.type != type_name:
            return False
        if len(layer.inputs) != len(bottoms) or len(layer.outputs) != len(tops):
            return False
        for idx, name in zip(bottoms + tops, list(layer.inputs) + list(layer.outputs)):
            if bn.setdefault(idx, name) != name:
                return False
        ln[i] = layer.name
    for i, name in ln.items():
        layer_names[i] = name
    blob_names.update(bn)
    for i, rec in enumerate(records):
        if rec[1] & CUSTOM_BIT:
            type_names[i] = custom[rec[1]]
    return True


def _names_from_idh(cand, records, layer_names, blob_names, type_names) -> bool:
    text = Path(cand).read_text("utf-8", "replace")
    layers: dict[int, str] = {}
    blobs: dict[int, str] = {}
    types: dict[int, str] = {}
    for kind, name, val, exact in _IDH_RE.findall(text):
        {"LAYER": layers, "BLOB": blobs, "TYPEINDEX": types}[kind][int(val)] = exact or name
    if not layers and not blobs:
        return False
    if any(i >= len(records) for i in layers):
        return False
    for i, name in layers.items():
        layer_names[i] = name
    for idx, name in blobs.items():
        if idx in blob_names:
            blob_names[idx] = name
    for i, rec in enumerate(records):
        if rec[1] & CUSTOM_BIT and rec[1] in types:
            type_names[i] = types[rec[1]]
    return True


# =========================================================================== writing

def vstr_to_float(s: str) -> float:
    """ncnn2mem's / ncnn's `vstr_to_float` (tools/ncnn2mem.cpp, src/paramdict.cpp): digits
    accumulated in uint32 (wrapping) and a double, then cast to float32."""
    i = 0
    n = len(s)
    sign = not (n and s[0] == "-")
    if n and s[0] in "+-":
        i += 1
    v1 = 0
    while i < n and s[i].isdigit():
        v1 = (v1 * 10 + ord(s[i]) - 48) & 0xFFFFFFFF
        i += 1
    v = float(v1)
    if i < n and s[i] == ".":
        i += 1
        pow10, v2 = 1, 0
        while i < n and s[i].isdigit():
            v2 = (v2 * 10 + ord(s[i]) - 48) & 0xFFFFFFFF
            pow10 = (pow10 * 10) & 0xFFFFFFFF
            i += 1
        v += v2 / pow10 if pow10 else (math.inf if v2 else math.nan)
    if i < n and s[i] in "eE":
        i += 1
        fact = not (i < n and s[i] == "-")
        if i < n and s[i] in "+-":
            i += 1
        expon = 0
        while i < n and s[i].isdigit():
            expon = (expon * 10 + ord(s[i]) - 48) & 0xFFFFFFFF
            i += 1
        scale = 1.0
        while expon >= 8:
            scale *= 1e8
            expon -= 8
        while expon > 0:
            scale *= 10.0
            expon -= 1
        v = v * scale if fact else v / scale
    with np.errstate(over="ignore"):
        f = np.float32(v if sign else -v)
    return float(f)


def _scanf_int(s: str) -> int:
    m = re.match(r"\s*([+-]?\d+)", s)
    v = int(m.group(1)) if m else 0
    return ((v + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def _is_float_text(s: str) -> bool:
    return "." in s or "e" in s.lower()


def _elem_bits(s: str) -> bytes:
    return _F32.pack(vstr_to_float(s)) if _is_float_text(s) else _I32.pack(_scanf_int(s))


def encode_token(token: str) -> bytes:
    """One `k=v` token of a text `.param` the way ncnn2mem writes it."""
    key, _, val = token.partition("=")
    pid = _scanf_int(key)
    if pid <= -23300:
        parts = val.split(",")
        n = _scanf_int(parts[0])
        elems = parts[1:1 + n]
        return _I32.pack(pid) + _I32.pack(len(elems)) + b"".join(_elem_bits(e) for e in elems)
    if val[:1].isalpha() or val[:1] == '"':
        s = val[1:] if val.startswith('"') else val
        if s.endswith('"'):
            s = s[:-1]
        raw = s.encode("utf-8", "surrogateescape")
        return (_I32.pack(-pid - 23400) + _I32.pack(len(raw))
                + raw + b"\0" * ((len(raw) + 3) // 4 * 4 - len(raw)))
    if "," in val:
        parts = [p for p in val.split(",")]
        if parts and parts[-1] == "":
            parts = parts[:-1]
        first_float = _is_float_text(parts[0])
        body = b"".join(_F32.pack(vstr_to_float(p)) if first_float else _I32.pack(_scanf_int(p))
                        for p in parts)
        return _I32.pack(-pid - 23300) + _I32.pack(len(parts)) + body
    return _I32.pack(pid) + _elem_bits(val)


def encode_value(pid: int, value: Value) -> bytes:
    """A typed value, bit-exact (used for values that have no original text)."""
    k = value.kind
    if k is Kind.INT:
        return _I32.pack(pid) + _I32.pack(value.value)
    if k is Kind.FLOAT:
        return _I32.pack(pid) + _F32.pack(value.value)
    if k is Kind.STRING:
        raw = str(value.value).encode("utf-8", "surrogateescape")
        return (_I32.pack(-pid - 23400) + _I32.pack(len(raw))
                + raw + b"\0" * ((len(raw) + 3) // 4 * 4 - len(raw)))
    if isinstance(value, Packed):  # already ncnn's element bits
        return (_I32.pack(-pid - 23300) + _I32.pack(len(value))
                + value.bits.astype("<i4", copy=False).tobytes())
    elems = value.value
    assert isinstance(elems, tuple)  # an array kind
    floats = k is Kind.FLOATS
    body = b"".join(
        (_F32.pack(x) if (isinstance(x, float) if is_mixed(value) else floats) else _I32.pack(x))
        for x in elems)
    return _I32.pack(-pid - 23300) + _I32.pack(len(elems)) + body


def encode_params(params: Params) -> bytes:
    """A layer's param section (without the end marker): original tokens as ncnn2mem
    encodes them, edited values bit-exact from their typed value."""
    if params.has_duplicates and not params.edited:
        return b"".join(encode_token(t) for t in params.tokens())
    return b"".join(encode_token(text) if text is not None else encode_value(pid, value)
                    for pid, value, text in params.encoding())


def _layout(g: Graph) -> tuple[bool, list[Layer], list[tuple[list[int], list[int]]], int]:
    """How `write_param_bin` lays `g` out: whether the records are written back raw, the
    layers written, each one's bottom and top blob indexes, the blob count."""
    layers = g.layers
    src = g.source
    extra = src.extra or {}
    raw_ok = (src.format == "param.bin" and not g.modified and "param_bin_header" in extra
              and all(not layer.edited and "param_bin_params" in layer.meta for layer in layers))
    if raw_ok:
        blobs = [(list(layer.meta["param_bin_blobs"][0]), list(layer.meta["param_bin_blobs"][1]))
                 for layer in layers]
        return True, layers, blobs, 1 + max((i for b, t in blobs for i in (*b, *t)), default=0)
    declared_layers = src.declared_layers
    if (not g.modified and declared_layers is not None and 0 < declared_layers < len(layers)
            and src.format == "param"):
        # ncnn (and ncnn2mem) read only the header's layer count; later lines are ignored
        layers = layers[:declared_layers]
    index: dict[str, int] = {}
    nblobs = 0
    out = []
    for layer in layers:
        bottoms = []
        for b in layer.inputs:
            if b not in index:
                index[b] = nblobs  # a bottom without producer: the text loader makes a blob
                nblobs += 1
            bottoms.append(index[b])
        tops = []
        for b in layer.outputs:
            tops.append(nblobs)
            index.setdefault(b, nblobs)
            nblobs += 1
        out.append((bottoms, tops))
    return False, layers, out, nblobs


def write_param_bin(g: Graph) -> bytes:
    """Serialise a graph as `.param.bin`. A graph read from `.param.bin` and not modified is
    written back byte for byte; otherwise every record is rebuilt (unedited params keep their
    raw bytes)."""
    src = g.source
    extra = src.extra or {}
    raw_ok, layers, blobs, nblobs = _layout(g)
    if raw_ok:
        parts = [extra["param_bin_header"]]
        for layer in layers:
            m = layer.meta
            b, t = m["param_bin_blobs"]
            parts.append(struct.pack(f"<3i{len(b)}i{len(t)}i", m["param_bin_type"], len(b),
                                     len(t), *b, *t))
            parts.append(m["param_bin_params"])
        parts.append(extra.get("param_bin_trailer", b""))
        return b"".join(parts)
    custom: dict[str, int] = {}
    body = []
    for layer, (bottoms, tops) in zip(layers, blobs):
        t = layer.type
        if t in TYPE_INDEX:
            typeindex = TYPE_INDEX[t]
        else:  # ncnn2mem: custom types numbered by first appearance
            typeindex = CUSTOM_BIT | custom.setdefault(t, len(custom))
        body.append(struct.pack(f"<3i{len(bottoms)}i{len(tops)}i", typeindex, len(bottoms),
                                len(tops), *bottoms, *tops))
        raw = layer.meta_value("param_bin_params")
        if raw is not None and not layer.params.edited:
            body.append(raw)
        else:
            body.append(encode_params(layer.params) + _I32.pack(EOP))
    declared = src.declared_blobs
    blob_count = declared if (declared is not None and not g.modified and declared >= nblobs) \
        else max(nblobs, 1)  # ncnn refuses blob_count 0 even for layers without blobs
    header = struct.pack("<3i", MAGIC, len(layers), blob_count)
    trailer = extra.get("param_bin_trailer", b"") if src.format == "param.bin" else b""
    return header + b"".join(body) + trailer


def id_h_path(param_bin: str) -> str:
    """`x.id.h` for `x.param.bin`: where ncnn2mem writes the names, and where reading
    `x.param.bin` looks for them."""
    return param_bin[: -len(".param.bin")] + ".id.h"


def write_id_h(g: Graph, name: str = "model") -> bytes:
    """The names of the `.param.bin` `write_param_bin(g)` writes, as ncnn2mem's `x.id.h`
    (`const int LAYER_<name> = i;`, `const int BLOB_<name> = i;`, `TYPEINDEX_<type>` for
    custom types), so reading it back, `diff` and `--report` show the layer and blob names.
    A name that is not a C identifier is written the way ncnn2mem sanitises it, with the
    name itself in a comment after it, which the reader takes."""
    _raw, layers, blobs, _n = _layout(g)
    ns = _c_ident(name)
    lines = [f"#ifndef NCNN_INCLUDE_GUARD_{ns}_id_h", f"#define NCNN_INCLUDE_GUARD_{ns}_id_h",
             f"namespace {ns}_param_id {{"]
    custom: dict[str, int] = {}
    seen: set[int] = set()
    for i, layer in enumerate(layers):
        lines.append(_id_line("LAYER", layer.name, i))
        if layer.type not in TYPE_INDEX and layer.type not in custom:
            custom[layer.type] = CUSTOM_BIT | len(custom)
            lines.append(_id_line("TYPEINDEX", layer.type, custom[layer.type]))
        for idx, blob in zip((*blobs[i][0], *blobs[i][1]), (*layer.inputs, *layer.outputs)):
            if idx not in seen:
                seen.add(idx)
                lines.append(_id_line("BLOB", blob, idx))
    lines += ["} // namespace " + f"{ns}_param_id", "#endif", ""]
    return "\n".join(lines).encode("utf-8")


def _c_ident(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _id_line(kind: str, name: str, value: int) -> str:
    ident = _c_ident(name)
    return f"const int {kind}_{ident} = {value};" + (f" // {name}" if ident != name else "")
