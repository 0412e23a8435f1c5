"""The `.bin` reader and writer: memory-mapped, zero-copy, byte-exact.

Reading walks the layers in file order, asks `schema.layer_reads` what each one loads,
and cuts the mapped file into `Weight` blobs (tag + payload + pad, exactly as stored).
Nothing is copied: a `Weight` is a (file, offset, length) triple until someone asks for its
values, and then `array()` is a read-only numpy view of the mapping.

Writing streams: runs of untouched weights that are contiguous in the source file are sent
with `os.copy_file_range` (kernel-side copy; `sendfile` / chunked `pread` fallbacks), so a
large `.bin` is never read into Python memory; only replaced or new weights are written from
memory. `load → save` with no change reproduces the file byte for byte (tags, pad bytes and,
when allowed on load, trailing bytes included).

Weights are immutable values: `replace` returns a new object, so graphs made with
`Graph.copy()` share untouched weights safely, and a pass can prove it left a layer's
weights alone by comparing `sha256` (or, cheaper, `same_bytes`, which needs no hashing when
both sides are still the same span of the same file).
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import struct
import weakref
from typing import IO, TYPE_CHECKING, Iterator, Mapping, Sequence

import numpy as np

from paramsurgery.core.errors import BinLayoutError, cannot_open
from paramsurgery.formats.weights import tags as T
from paramsurgery.formats.weights.schema import PACKED, RAW, TAGGED, Read, SchemaError, layer_reads, reads_for

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph
    from paramsurgery.ir.layer import Layer

_CHUNK = 8 << 20
_U32 = struct.Struct("<I")


# ============================================================================ the file

class WeightFile:
    """A `.bin` opened for reading: a read-only mapping plus an fd for kernel-side copies.

    `size` is the file size, `consumed` the bytes the layers account for, `trailing` the
    bytes after them (kept on save; ncnn ignores them)."""

    def __init__(self, path: str | None, data, fd: int | None, size: int) -> None:
        self.path = path
        self.data = data  # mmap.mmap, bytes or memoryview
        self.fd = fd
        self.size = size
        self.consumed = 0
        self.keep_trailing = True
        if fd is not None:
            self._finalizer = weakref.finalize(self, os.close, fd)

    @classmethod
    def open(cls, path: str | os.PathLike) -> "WeightFile":
        path_s = os.fspath(path)
        try:
            fd = os.open(path_s, os.O_RDONLY)
        except OSError as exc:
            raise BinLayoutError(cannot_open(exc), file=path_s) from None
        try:
            size = os.fstat(fd).st_size
            data = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else b""
        except (OSError, ValueError) as exc:
            os.close(fd)
            raise BinLayoutError(f"cannot map the file: {exc}", file=path_s) from None
        return cls(path_s, data, fd, size)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview,
                   name: str | None = None) -> "WeightFile":
        return cls(name, bytes(data), None, len(data))

    @property
    def trailing(self) -> int:
        return self.size - self.consumed

    def view(self, offset: int, n: int) -> memoryview:
        return memoryview(self.data)[offset:offset + n]

    def u32(self, offset: int) -> int:
        """The little-endian uint32 at `offset` (a weight's tag), read with a system call
        when the file is open: a read through the mapping maps in the pages around it (a
        whole large folio, hundreds of KB per tag: a quarter of a decoder's weight bytes
        resident after a load that reads only the tags)."""
        if self.fd is not None:
            return _U32.unpack(os.pread(self.fd, 4, offset))[0]
        return _U32.unpack_from(self.data, offset)[0]

    def release(self, offset: int, n: int) -> None:
        """Drop the pages of bytes just read from this process's memory (they stay in the
        kernel's page cache): a pass over a whole multi-GB file, such as hashing it, then
        does not leave the file resident in the process (RSS counts mapped pages)."""
        data = self.data
        if isinstance(data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED") and n > 0:
            start = offset - offset % mmap.PAGESIZE
            data.madvise(mmap.MADV_DONTNEED, start, offset + n - start)

    def __repr__(self) -> str:
        return f"<WeightFile {self.path or '<memory>'} {self.size} bytes>"


# ============================================================================ one blob

class Weight:
    """One weight blob exactly as stored: optional tag, payload, pad.

    role     name in the layer's schema ("weight", "bias", "A", "q_weight", ...)
    mode     "tagged" (`load(n,0)`), "raw" (`load(n,1)`) or "packed" (wheel block quant)
    count    elements (bytes for packed)
    shape    numpy shape (see schema.py)
    dtype    storage kind: fp32 fp16 bf16 int8 fp32s lut8 (tagged), raw, packed
    tag      uint32 tag, None for raw/packed
    offset   offset in the source `.bin` (None for a new or replaced weight)
    nbytes   bytes in the file (tag + payload + pad)
    """

    __slots__ = ("role", "mode", "count", "shape", "dtype", "tag", "_file", "_offset",
                 "nbytes", "_bytes", "_sha")

    def __init__(self, role: str, mode: str, count: int, shape: tuple[int, ...], dtype: str,
                 tag: int | None, nbytes: int, *, file: WeightFile | None = None,
                 offset: int | None = None, data: bytes | bytearray | None = None) -> None:
        self.role = role
        self.mode = mode
        self.count = count
        self.shape = shape
        self.dtype = dtype
        self.tag = tag
        self.nbytes = nbytes
        self._file = file
        self._offset = offset
        self._bytes = data
        self._sha: str | None = None

    # ------------------------------------------------------------------ bytes
    @property
    def offset(self) -> int | None:
        return self._offset if self._file is not None else None

    @property
    def untouched(self) -> bool:
        """True while this blob is still a span of the file it was read from."""
        return self._file is not None

    @property
    def source(self) -> WeightFile | None:
        return self._file

    def raw(self) -> memoryview:
        """All stored bytes: tag + payload + pad (zero-copy for untouched weights)."""
        f, off = self._file, self._offset
        if f is not None and off is not None:  # a span of the file it was read from
            return f.view(off, self.nbytes)
        return memoryview(self._bytes or b"")

    @property
    def header_size(self) -> int:
        return 4 if self.mode == TAGGED else 0

    def payload(self) -> memoryview:
        """The bytes after the tag, pad included."""
        return self.raw()[self.header_size:]

    @property
    def pad(self) -> bytes:
        used = T.data_size(self.dtype, self.count)
        return bytes(self.payload()[used:])

    @property
    def sha256(self) -> str:
        """sha256 of the stored bytes (tag and pad included), computed once."""
        if self._sha is None:
            h = hashlib.sha256()
            mv = self.raw()
            for i in range(0, len(mv), _CHUNK):
                h.update(mv[i:i + _CHUNK])
                if self._file is not None and self._offset is not None:
                    self._file.release(self._offset + i, min(_CHUNK, len(mv) - i))
            self._sha = h.hexdigest()
        return self._sha

    def same_bytes(self, other: "Weight") -> bool:
        """Byte equality; free when both are the same span of the same file."""
        if self is other:
            return True
        if (self._file is not None and self._file is other._file
                and self._offset == other._offset and self.nbytes == other.nbytes):
            return True
        return self.nbytes == other.nbytes and self.sha256 == other.sha256

    # ------------------------------------------------------------------ values
    def array(self) -> np.ndarray:
        """The values with their stored dtype and `shape`: a read-only zero-copy view for
        fp32/raw/fp32s (float32), fp16 (float16), int8 (int8) and packed (uint8). bf16 and
        lut8 have no numpy dtype: they are decoded to float32 (a copy)."""
        if self.dtype in (T.BF16, T.LUT):
            return self.float32()
        dt = T.NUMPY_DTYPE[self.dtype]
        f, off = self._file, self._offset
        if f is not None and off is not None and isinstance(f.data, mmap.mmap):
            a = np.frombuffer(f.data, dtype=dt, count=self.count, offset=off + self.header_size)
        else:
            a = np.frombuffer(self.payload(), dtype=dt, count=self.count)
            a.flags.writeable = False  # blobs are immutable values (their hash is cached)
        return a.reshape(self.shape)

    def float32(self) -> np.ndarray:
        """The values as float32, as ncnn has them after loading (int8/packed: the integer
        values as floats)."""
        if self.dtype in (T.FP32, T.RAW, T.FP32_SCALED):
            return self.array()
        v = T.decode_float32(self.dtype, self.payload(), self.count)
        return v.astype(np.float32).reshape(self.shape)

    # ------------------------------------------------------------------ edits
    def replace(self, values, *, dtype: str | None = None, pad: bytes | None = None,
                allow_resize: bool = False) -> "Weight":
        """A new blob with `values` in this blob's slot.

        Storage: untagged reads stay raw float32 (packed stays bytes). A tagged read is
        stored as `dtype` if given ("fp32", "fp16", "bf16", "int8", "fp32s", or "same" to
        keep this blob's kind), else by the array's dtype: float16 → fp16, int8 → int8,
        anything else → fp32 with tag 0. Pad bytes are this blob's when the new pad has the
        same length (pnnx's `83 22` survive), else zeros, unless `pad` is given.
        A different element count is refused unless `allow_resize` (then the layer's params
        must change to match before saving; the writer checks)."""
        arr = np.asarray(values)
        if arr.size != self.count and not allow_resize:
            raise BinLayoutError(f"weight {self.role!r} holds {self.count} elements "
                                 f"{tuple(self.shape)}; got {arr.size} {tuple(arr.shape)} "
                                 f"(pass allow_resize=True and change the params to match)")
        shape = self.shape if arr.size == self.count else tuple(arr.shape)
        if dtype == "same":
            dtype = self.dtype
        new = make_weight(self.role, self.mode, arr, shape=shape, dtype=dtype,
                          pad=pad, like=self)
        return new

    def __repr__(self) -> str:
        where = f"@{self._offset}" if self._file is not None else "(new)"
        return (f"Weight({self.role} {self.dtype} {tuple(self.shape)} {self.nbytes}B {where})")


def make_weight(role: str, mode: str, values,
                *, shape: tuple[int, ...] | None = None,
                dtype: str | None = None, pad: bytes | None = None,
                like: Weight | None = None) -> Weight:
    """Encode `values` as a blob for a read of `mode` (see `Weight.replace`)."""
    if isinstance(values, Weight):
        if values.mode != mode:
            raise BinLayoutError(f"weight {role!r}: cannot reuse a {values.mode} blob for a "
                                 f"{mode} read")
        w = values
        return Weight(role, w.mode, w.count, shape or w.shape, w.dtype, w.tag, w.nbytes,
                      file=w._file, offset=w._offset, data=w._bytes)
    arr = np.asarray(values)
    shape = tuple(shape) if shape is not None else tuple(arr.shape)
    count = int(arr.size)
    if mode == RAW:
        if dtype not in (None, T.RAW, T.FP32):
            raise BinLayoutError(f"weight {role!r} is an untagged float32 read; it cannot be "
                                 f"stored as {dtype}")
        _check_float(role, arr)
        return _encoded(role, RAW, count, shape, T.RAW, None, arr, pad, like)
    if mode == PACKED:
        if arr.dtype not in (np.uint8, np.int8):
            raise BinLayoutError(f"weight {role!r} is packed bytes: give a uint8 array")
        return _encoded(role, PACKED, count, shape, T.PACKED, None, arr.view(np.uint8)
                        if arr.dtype == np.int8 else arr, pad, like)
    # tagged
    if dtype is None:
        dtype = {np.dtype(np.float16): T.FP16, np.dtype(np.int8): T.INT8}.get(arr.dtype, T.FP32)
    if dtype not in T.DTYPE_TAG:
        raise BinLayoutError(f"weight {role!r}: cannot store values as {dtype!r} "
                             f"(choose fp32, fp16, bf16, int8 or fp32s)")
    if dtype == T.INT8:
        if arr.dtype != np.int8:
            raise BinLayoutError(f"weight {role!r}: int8 storage needs an int8 array")
    elif dtype != T.BF16 or arr.dtype != np.uint16:
        _check_float(role, arr)
    return _encoded(role, TAGGED, count, shape, dtype, T.DTYPE_TAG[dtype], arr, pad, like)


def _encoded(role: str, mode: str, count: int, shape: tuple[int, ...], dtype: str,
             tag: int | None, arr: np.ndarray, pad: bytes | None,
             like: Weight | None) -> Weight:
    """Serialise into one preallocated buffer: tag, payload, pad."""
    head = 4 if tag is not None else 0
    used = T.data_size(dtype, count)
    total = head + T.payload_size(dtype, count)
    buf = bytearray(total)
    mv = memoryview(buf)
    if tag is not None:
        struct.pack_into("<I", buf, 0, tag)
    T.encode_into(dtype, arr, mv[head:head + used])
    buf[head + used:] = _pad_bytes(used, total - head, pad, like)
    return Weight(role, mode, count, shape, dtype, tag, total, data=buf)


def _check_float(role: str, arr: np.ndarray) -> None:
    if arr.dtype.kind not in "fiu":
        raise BinLayoutError(f"weight {role!r}: expected numbers, got dtype {arr.dtype}")


def _pad_bytes(used: int, total: int, pad: bytes | None, like: Weight | None) -> bytes:
    n = total - used
    if n <= 0:
        return b""
    if pad is not None:
        if len(pad) != n:
            raise BinLayoutError(f"pad must be {n} bytes, got {len(pad)}")
        return bytes(pad)
    if like is not None:
        old = like.pad
        if len(old) == n:
            return old
    return bytes(n)


# ============================================================================ a layer's blobs

class LayerWeights(Sequence[Weight]):
    """A layer's weights in `load_model` order. Index by position or role name
    (`lw["bias"]`); immutable: `replace` returns a new LayerWeights, so assign it back
    (`layer.weights = layer.weights.replace("bias", b)`, or `replace_weight(layer, ...)`).

    `assumed` is True for a layer of a type paramsurgery has no schema for (not ncnn's, not
    registered): it is taken to read nothing."""

    __slots__ = ("_items", "assumed")

    def __init__(self, items: Sequence[Weight] = (), *, assumed: bool = False) -> None:
        self._items = tuple(items)
        self.assumed = assumed

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Weight]:
        return iter(self._items)

    def __getitem__(self, key):
        if isinstance(key, str):
            for w in self._items:
                if w.role == key:
                    return w
            raise KeyError(f"no weight {key!r} (has {', '.join(self.roles) or 'none'})")
        return self._items[key]

    def get(self, role: str) -> Weight | None:
        for w in self._items:
            if w.role == role:
                return w
        return None

    @property
    def roles(self) -> list[str]:
        return [w.role for w in self._items]

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self._items)

    @property
    def sha256(self) -> str:
        """One hash over the layer's blobs (their roles and stored bytes)."""
        h = hashlib.sha256()
        for w in self._items:
            h.update(w.role.encode())
            h.update(b"\0")
            h.update(w.sha256.encode())
        return h.hexdigest()

    @property
    def untouched(self) -> bool:
        return all(w.untouched for w in self._items)

    def same_bytes(self, other: "LayerWeights | None") -> bool:
        if other is None or len(other) != len(self):
            return False
        return all(a.role == b.role and a.same_bytes(b) for a, b in zip(self, other))

    def replace(self, role: str, values, **kw) -> "LayerWeights":
        """A copy with one blob replaced (see `Weight.replace` for the keyword options)."""
        items = list(self._items)
        for i, w in enumerate(items):
            if w.role == role:
                items[i] = w.replace(values, **kw)
                return LayerWeights(items)
        raise KeyError(f"no weight {role!r} (has {', '.join(self.roles) or 'none'})")

    def __repr__(self) -> str:
        return "LayerWeights(" + ", ".join(repr(w) for w in self._items) + ")"


# ============================================================================ reading

def _where(layer: "Layer") -> str:
    """`layer 'name' (Type)`; errors carry the layer's `file:line` as their location, and a
    layer without a line (from a .param.bin, or new) says where it is here."""
    if layer.source_line is not None:
        return f"layer {layer.name!r} ({layer.type})"
    return f"layer {layer.name!r} ({layer.type}, {layer.where()})"


def _err(layer: "Layer", msg: str, wf: WeightFile, unknown: list["Layer"]) -> BinLayoutError:
    if unknown:
        names = ", ".join(f"{u.name!r} ({u.type}, line {u.source_line})" for u in unknown[:3])
        msg += (f"; note: layers of types without a weight schema come earlier and were "
                f"taken to have no weights: {names}")
    return BinLayoutError(f"{_where(layer)}: {msg} [{wf.path or '<bin>'}]",
                          file=layer.source_file, line=layer.source_line)


def parse_layer(layer: "Layer", reads: list[Read], wf: WeightFile, offset: int, *,
                allow_lut: bool = False,
                unknown: Sequence["Layer"] = ()) -> tuple[LayerWeights, int]:
    """Cut one layer's blobs out of `wf` starting at `offset`."""
    size = wf.size
    out = []
    for r in reads:
        if r.count == 0 and r.required:
            raise _err(layer, f"weight {r.role!r} has 0 elements (check the params): ncnn's "
                              f"load_model fails on it (offset {offset})", wf, list(unknown))
        start = offset
        if r.mode == TAGGED:
            if offset + 4 > size:
                raise _err(layer, f"weight {r.role!r} ({r.count} elements) needs a 4-byte tag "
                                  f"at offset {offset} but the file ends at {size}", wf,
                           list(unknown))
            tag = wf.u32(offset)
            dtype = T.tag_dtype(tag)
            if dtype == T.LUT and not allow_lut:
                raise _err(layer, f"weight {r.role!r}: unknown tag 0x{tag:08X} at offset "
                                  f"{offset} (expected 0 fp32, 0x01306B47 fp16, 0x01348B83 "
                                  f"bf16, 0x000D4B38 int8 or 0x0002C056; ncnn would read it "
                                  f"as a 256-entry table; allow_lut=True accepts that)", wf,
                           list(unknown))
            offset += 4
        elif r.mode == RAW:
            tag, dtype = None, T.RAW
        else:
            tag, dtype = None, T.PACKED
        n = T.payload_size(dtype, r.count)
        if offset + n > size:
            raise _err(layer, f"weight {r.role!r} ({dtype}, {r.count} elements) needs {n} "
                              f"bytes at offset {offset} but the file ends at {size} "
                              f"({size - offset} left)", wf, list(unknown))
        offset += n
        out.append(Weight(r.role, r.mode, r.count, r.shape, dtype, tag, offset - start,
                          file=wf, offset=start))
    return LayerWeights(out), offset


def attach_weights(graph: "Graph", bin_path, *, allow_trailing: bool = False,
                   allow_lut: bool = False) -> "Graph":
    """Read a `.bin` for `graph`: every layer gets `layer.weights` (a LayerWeights) and
    `graph.weights` the WeightFile. Exact accounting: a short file, bytes left after the last
    layer (unless `allow_trailing`, as ncnn tolerates), an unknown tag (unless `allow_lut`),
    or params for which ncnn's load_model fails raise BinLayoutError naming the layer, its
    `file:line` and the offset. Layers of types without a schema (not ncnn's) are taken to
    read nothing; if the bytes then do not add up, the error says so."""
    from paramsurgery.core.collector import paused_gc

    if isinstance(bin_path, (bytes, bytearray, memoryview)):
        wf = WeightFile.from_bytes(bin_path)
    else:
        wf = WeightFile.open(bin_path)
    offset = 0
    unknown: list["Layer"] = []
    last_weighted: "Layer | None" = None
    with paused_gc():
        for layer in graph:
            try:
                reads = reads_for(layer.type, layer.params)
            except SchemaError as exc:
                reads = _pnnx_bool_reads(layer)
                if reads is None:
                    raise _err(layer, f"{exc.message} (offset {offset})", wf, unknown) from None
            if reads is None:
                unknown.append(layer)
                layer.weights = LayerWeights((), assumed=True)
                continue
            if not reads:
                layer.weights = _EMPTY
                continue
            layer.weights, offset = parse_layer(layer, reads, wf, offset, allow_lut=allow_lut,
                                                unknown=unknown)
            last_weighted = layer
    wf.consumed = offset
    if offset != wf.size and not allow_trailing:
        left = wf.size - offset
        if last_weighted is None:
            msg = (f"{left} bytes but no layer of this graph reads weights "
                   f"[{wf.path or '<bin>'}]")
            if unknown:
                u = unknown[0]
                msg += (f"; layers of types without a weight schema may own them: {u.name!r} "
                        f"({u.type}, {u.where()})")
            raise BinLayoutError(msg, file=graph.source.path)
        raise _err(last_weighted, f"{left} bytes left over after the last layer's weights, "
                                  f"at offset {offset} of {wf.size} (ncnn ignores trailing "
                                  f"bytes; allow_trailing=True accepts them)", wf, unknown)
    graph.weights = wf
    graph.source.bin_path = wf.path
    return graph


_EMPTY = LayerWeights(())

# pnnx's load type for a bool tensor (`MemoryData ... 21=3`, e.g. GPT-2's eager causal
# mask): ncnn has no such load type ("ModelBin load type 3 not implemented", load_model
# fails), and pnnx writes its values as one byte each, padded to 4 bytes (measured on the
# zoo's GPT-2 eager exports: the 49 bytes of a 7x7 mask, then 3 zero bytes, then the next
# layer's float32 weights)
PNNX_BOOL_LOAD_TYPE = 3


def _pnnx_bool_reads(layer: "Layer") -> list[Read] | None:
    """The bytes pnnx wrote for a bool MemoryData (read so the graph loads and
    `fix-bool-table` can rewrite them as float32 0/1, which ncnn loads); None for any other
    layer ncnn's load_model fails on (the error stands). Lint PS020 reports the layer."""
    if layer.type != "MemoryData" or layer.params.get(21, 1) != PNNX_BOOL_LOAD_TYPE:
        return None
    dims = [layer.params.get_int(pid, 0) for pid in (2, 11, 1, 0)]  # c, d, h, w
    shape = tuple(d for d in dims if d)
    count = int(np.prod(shape)) if shape else 0
    if count <= 0:
        return None
    return [Read("data", count, PACKED, shape)]


# ============================================================================ building

def set_weights(layer: "Layer", values: Mapping[str, object] | None = None, *,
                dtype: str | None = None, **arrays) -> "Layer":
    """Give a layer new weights for its current params, one array (or `Weight`, reused
    zero-copy) per role of its schema, e.g. for a fused Embed:
    ``set_weights(emb, weight=np.concatenate([a.weights["weight"].array(), ...]))``.
    float16 arrays are stored fp16 (bytes kept exactly), int8 as int8, others fp32 unless
    `dtype` says otherwise; untagged reads are raw float32. Returns the layer."""
    vals = dict(values or {})
    vals.update(arrays)
    reads = layer_reads(layer)
    if reads is None:
        raise BinLayoutError(f"{_where(layer)}: no weight schema for type {layer.type!r} "
                             f"(register one with paramsurgery.formats.weights.register_schema)",
                             file=layer.source_file, line=layer.source_line)
    roles = {r.role for r in reads}
    extra = set(vals) - roles
    if extra:
        raise BinLayoutError(f"{_where(layer)}: no weight named {', '.join(sorted(extra))}; "
                             f"its params read {', '.join(r.role for r in reads) or 'nothing'}")
    out = []
    for r in reads:
        if r.role not in vals:
            raise BinLayoutError(f"{_where(layer)}: missing weight {r.role!r} "
                                 f"({r.mode}, {r.count} elements {r.shape})")
        v = vals[r.role]
        if isinstance(v, Weight):
            if v.count != r.count:
                raise BinLayoutError(f"{_where(layer)}: weight {r.role!r} needs {r.count} "
                                     f"elements, the given blob has {v.count}")
            out.append(make_weight(r.role, r.mode, v, shape=r.shape))
            continue
        arr = np.asarray(v)
        if arr.size != r.count:
            raise BinLayoutError(f"{_where(layer)}: weight {r.role!r} needs {r.count} elements "
                                 f"{r.shape}, got {arr.size} {tuple(arr.shape)}")
        out.append(make_weight(r.role, r.mode, arr, shape=r.shape,
                               dtype=dtype if r.mode == TAGGED else None, pad=None))
    layer.weights = LayerWeights(out)
    return layer


def replace_weight(layer: "Layer", role: str, values, **kw) -> "Layer":
    """Replace one blob of a layer (see `Weight.replace`); returns the layer."""
    if layer.weights is None:
        raise BinLayoutError(f"{_where(layer)} has no weights loaded",
                             file=layer.source_file, line=layer.source_line)
    try:
        layer.weights = layer.weights.replace(role, values, **kw)
    except BinLayoutError as exc:
        raise BinLayoutError(f"{_where(layer)}: {exc.message}", file=layer.source_file,
                             line=layer.source_line) from None
    return layer


# ============================================================================ writing

def check_layer(layer: "Layer") -> list[Read] | None:
    """The layer's current reads, checked against the weights it holds (a bool MemoryData
    writes back the bytes pnnx wrote, as it was read)."""
    reads = _pnnx_bool_reads(layer) or layer_reads(layer)
    lw = layer.weights
    if reads is None:
        return None
    if not reads:
        if lw is not None and len(lw):
            raise BinLayoutError(f"{_where(layer)}: holds weights ({', '.join(lw.roles)}) but "
                                 f"its params read none", file=layer.source_file,
                                 line=layer.source_line)
        return reads
    if lw is None:
        raise BinLayoutError(f"{_where(layer)}: has no weights (its params read "
                             f"{', '.join(f'{r.role}[{r.count}]' for r in reads)}); load a "
                             f".bin, or set them with paramsurgery.formats.weights.set_weights",
                             file=layer.source_file, line=layer.source_line)
    want = [(r.role, r.mode, r.count) for r in reads]
    have = [(w.role, w.mode, w.count) for w in lw]
    if want != have:
        raise BinLayoutError(
            f"{_where(layer)}: its params read "
            f"{', '.join(f'{a}[{c}]' for a, _, c in want)} but it holds "
            f"{', '.join(f'{a}[{c}]' for a, _, c in have)}; change the params and weights "
            f"together", file=layer.source_file, line=layer.source_line)
    for r in reads:
        if r.count == 0 and r.required:
            raise BinLayoutError(f"{_where(layer)}: weight {r.role!r} has 0 elements: ncnn's "
                                 f"load_model fails on it", file=layer.source_file,
                                 line=layer.source_line)
    return reads


def iter_blobs(graph: "Graph") -> Iterator[tuple["Layer", Weight]]:
    """Every blob the `.bin` of `graph` holds, in file order, after checking each layer."""
    for layer in graph:
        check_layer(layer)
        lw = layer.weights
        if lw is not None:
            for w in lw:
                yield layer, w


class _Sink:
    """Writes to a real file with kernel-side copies from source files, or to any binary
    stream with chunked writes."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.written = 0
        self.fd: int | None
        try:
            self.fd = fh.fileno()
            fh.flush()
        except (AttributeError, io.UnsupportedOperation, OSError):
            self.fd = None
        self.pending: tuple[WeightFile, int, int] | None = None

    def copy(self, wf: WeightFile, offset: int, n: int) -> None:
        p = self.pending
        if p is not None and p[0] is wf and p[1] + p[2] == offset:
            self.pending = (wf, p[1], p[2] + n)
            return
        self.flush_pending()
        self.pending = (wf, offset, n)

    def write(self, data: bytes | memoryview) -> None:
        self.flush_pending()
        if self.fd is not None:
            mv = memoryview(data)
            while mv:
                k = os.write(self.fd, mv)
                mv = mv[k:]
        else:
            self.fh.write(data)
        self.written += len(data)

    def flush_pending(self) -> None:
        p = self.pending
        if p is None:
            return
        self.pending = None
        wf, offset, n = p
        self.written += n
        if self.fd is not None and wf.fd is not None:
            _copy_fd(wf.fd, self.fd, offset, n)
            return
        mv = wf.view(offset, n)
        for i in range(0, n, _CHUNK):
            chunk = mv[i:i + _CHUNK]
            if self.fd is not None:
                c = chunk
                while c:
                    k = os.write(self.fd, c)
                    c = c[k:]
            else:
                self.fh.write(chunk)


def _copy_fd(src: int, dst: int, offset: int, n: int) -> None:
    """Copy n bytes at `offset` of src to dst's current position, in the kernel if we can."""
    done = 0
    cfr = getattr(os, "copy_file_range", None)
    while done < n and cfr is not None:
        try:
            k = cfr(src, dst, min(n - done, 1 << 30), offset + done)
        except OSError:
            break
        if k <= 0:
            break
        done += k
    while done < n and hasattr(os, "sendfile"):
        try:
            k = os.sendfile(dst, src, offset + done, min(n - done, 1 << 30))
        except OSError:
            break
        if k <= 0:
            break
        done += k
    while done < n:
        chunk = os.pread(src, min(n - done, _CHUNK), offset + done)
        if not chunk:
            raise BinLayoutError(f"source .bin shrank while copying (offset {offset + done})")
        mv = memoryview(chunk)
        while mv:
            k = os.write(dst, mv)
            mv = mv[k:]
        done += len(chunk)


def write_weights(graph: "Graph", fh: IO[bytes]) -> int:
    """Stream the `.bin` of `graph` into `fh`; returns the bytes written. Every layer's
    weights are checked against what its current params read first (BinLayoutError
    otherwise). Untouched blobs are copied from the source file kernel-side."""
    blobs = list(iter_blobs(graph))  # validate everything before writing a byte
    sink = _Sink(fh)
    for _layer, w in blobs:
        if w._file is not None and w._offset is not None:
            sink.copy(w._file, w._offset, w.nbytes)
        else:
            sink.write(w.raw())
    wf = graph.weights
    if isinstance(wf, WeightFile) and wf.keep_trailing and wf.trailing > 0:
        sink.copy(wf, wf.consumed, wf.trailing)
    sink.flush_pending()
    return sink.written


def weights_bytes(graph: "Graph") -> bytes:
    """The whole `.bin` in memory (small graphs, tests)."""
    buf = io.BytesIO()
    write_weights(graph, buf)
    return buf.getvalue()
