"""The ncnn oracle for weight layouts: a recording `ncnn.DataReader`.

`record_reads(param, bin)` serves a `.bin` to the real `Net.load_model` through a Python
subclass of `ncnn.DataReader` and records the (offset, size) of every read ncnn makes.
The wheel's binding hands `read(buf, size)` a PyCapsule holding the destination pointer;
`ctypes.pythonapi.PyCapsule_GetPointer` turns it into an address we `memmove` into.
(`reference()` is not overridable from Python, so ncnn always falls back to `read`, which
is what makes every access visible.)

`predicted_reads(graph)` is the same list computed from our schemas and the tags actually
in the file; `check(param, bin)` compares the two read for read. ncnn may crash on some
inputs (int8-tagged weights in a float layer segfault in create_pipeline), so recording runs
in a child process by default; reads are streamed to the parent as they happen, so a crash
after the last read still yields the full list.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from paramsurgery.formats.weights import tags as T
from paramsurgery.runtime.launch import run_child
from paramsurgery.formats.weights.schema import PACKED, RAW, TAGGED

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph

ReadRec = tuple[int, int]


@dataclass
class Recording:
    """What ncnn did: load_param / load_model return codes (None if it crashed before),
    the reads, and the child's exit signal if it died."""

    load_param: int | None
    load_model: int | None
    reads: list[ReadRec] = field(default_factory=list)
    crashed: int | None = None  # signal number
    stderr: str = ""


def _capsule_api():
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    name = ctypes.pythonapi.PyCapsule_GetName
    name.restype = ctypes.c_char_p
    name.argtypes = [ctypes.py_object]
    return get, name


def make_reader(data, on_read=None):
    """An `ncnn.DataReader` serving `data` (bytes-like; a writable buffer or bytes) that
    appends (offset, size) of each read to `.reads` and calls `on_read(offset, size)`."""
    import ncnn

    get, name = _capsule_api()
    n = len(data)
    if n:
        try:
            base = ctypes.addressof(ctypes.c_char.from_buffer(data))
            keep = data
        except TypeError:  # read-only buffer: one private copy
            keep = ctypes.create_string_buffer(bytes(data), n)
            base = ctypes.addressof(keep)
    else:
        base, keep = 0, None

    class RecordingReader(ncnn.DataReader):
        def __init__(self) -> None:
            super().__init__()
            self.pos = 0
            self.reads: list[ReadRec] = []
            self._keep = keep

        def scan(self, fmt, p):
            return 0

        def read(self, buf, size):
            ptr = get(buf, name(buf))
            k = max(0, min(size, n - self.pos))
            if k:
                ctypes.memmove(ptr, base + self.pos, k)
            self.reads.append((self.pos, size))
            if on_read is not None:
                on_read(self.pos, size)
            self.pos += k
            return k

    return RecordingReader()


def _open_data(bin_path: str | None):
    if bin_path is None:
        return bytearray()
    size = os.path.getsize(bin_path)
    if size == 0:
        return bytearray()
    with open(bin_path, "rb") as fh:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)  # writable view, no copy


def record_in_process(param_path: str, bin_path: str | None, *, binary_param: bool = False,
                      on_read=None) -> Recording:
    """Load `param_path` (text, or `.param.bin` with `binary_param`) and record the reads
    of `Net.load_model` on `bin_path` in this process."""
    import ncnn

    net = ncnn.Net()
    opt = net.opt
    opt.use_vulkan_compute = False
    opt.num_threads = 1
    # cheaper create_pipeline (no weight re-layout); reads happen before it and do not change
    for key in ("use_winograd_convolution", "use_sgemm_convolution", "use_packing_layout",
                "use_fp16_storage", "use_fp16_packed", "use_fp16_arithmetic",
                "use_local_pool_allocator"):
        if hasattr(opt, key):
            setattr(opt, key, False)
    lp = net.load_param_bin(param_path) if binary_param else net.load_param(param_path)
    if lp != 0:
        return Recording(lp, None)
    data = _open_data(bin_path)
    reader = make_reader(data, on_read)
    lm = net.load_model(reader)
    return Recording(lp, lm, list(reader.reads))


_CHILD = r"""
import os, sys
sys.path.insert(0, {root!r})
from paramsurgery.formats.weights.oracle import record_in_process
def on_read(off, size):
    os.write(1, b"R %d %d\n" % (off, size))
r = record_in_process({param!r}, {bin!r}, binary_param={binary!r}, on_read=on_read)
os.write(1, b"D %s %s\n" % (str(r.load_param).encode(), str(r.load_model).encode()))
"""


def record_reads(param, bin_path=None, *, binary_param: bool | None = None,
                 isolate: bool = True, timeout: float = 300) -> Recording:
    """Record every read ncnn's `Net.load_model` makes. `param` is a path (text or
    `.param.bin`, detected by the magic) or text; `bin_path` a path, bytes or None (empty)."""
    tmp: list[str] = []
    try:
        if isinstance(param, (bytes, str)) and not (isinstance(param, str)
                                                   and os.path.exists(param)):
            fd, p = tempfile.mkstemp(suffix=".param")
            with os.fdopen(fd, "wb") as fh:
                fh.write(param.encode("utf-8", "surrogateescape") if isinstance(param, str)
                         else param)
            tmp.append(p)
            param = p
        param = os.fspath(param)
        if binary_param is None:
            with open(param, "rb") as fh:
                binary_param = fh.read(4) == b"\xdd\x85\x76\x00"
        if isinstance(bin_path, (bytes, bytearray, memoryview)):
            fd, b = tempfile.mkstemp(suffix=".bin")
            with os.fdopen(fd, "wb") as fh:
                fh.write(bin_path)
            tmp.append(b)
            bin_path = b
        elif bin_path is not None:
            bin_path = os.fspath(bin_path)
        if not isolate:
            return record_in_process(param, bin_path, binary_param=binary_param)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        code = _CHILD.format(root=root, param=param, bin=bin_path, binary=binary_param)
        proc = run_child("-c", code, timeout=timeout, text=False)
        if proc.timed_out:
            raise subprocess.TimeoutExpired("weights oracle child", timeout)
        rec = Recording(None, None, stderr=(proc.stderr or b"").decode("utf-8", "replace"))
        for line in (proc.stdout or b"").splitlines():
            parts = line.split()
            if parts[0] == b"R":
                rec.reads.append((int(parts[1]), int(parts[2])))
            elif parts[0] == b"D":
                rec.load_param = int(parts[1])
                rec.load_model = None if parts[2] == b"None" else int(parts[2])
        rec.crashed = proc.signal
        return rec
    finally:
        for p in tmp:
            os.unlink(p)


_CHILD_MANY = r"""
import json, os, sys
sys.path.insert(0, {root!r})
from paramsurgery.formats.weights.oracle import record_in_process
def on_read(off, size):
    os.write(1, b"R %d %d\n" % (off, size))
for i, (param, bin, binary) in enumerate(json.loads(sys.stdin.read())):
    os.write(1, b"J %d\n" % i)
    r = record_in_process(param, bin, binary_param=binary, on_read=on_read)
    os.write(1, b"D %s %s\n" % (str(r.load_param).encode(), str(r.load_model).encode()))
"""


def record_many(jobs: list[tuple[str, str | None]], *, timeout: float = 600) -> list[Recording]:
    """`record_reads` for many (param path, bin path) pairs in as few child processes as
    possible (a crash only costs the job it happened in)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    specs = []
    for param, bin_path in jobs:
        with open(param, "rb") as fh:
            binary = fh.read(4) == b"\xdd\x85\x76\x00"
        specs.append((os.fspath(param), None if bin_path is None else os.fspath(bin_path), binary))
    results: list[Recording] = [Recording(None, None) for _ in specs]
    start = 0
    while start < len(specs):
        proc = run_child("-c", _CHILD_MANY.format(root=root), timeout=timeout, text=False,
                         input=json.dumps(specs[start:]).encode())
        if proc.timed_out:
            raise subprocess.TimeoutExpired("weights oracle child", timeout)
        cur = None
        for line in (proc.stdout or b"").splitlines():
            parts = line.split()
            if parts[0] == b"J":
                cur = results[start + int(parts[1])]
                last = start + int(parts[1])
            elif parts[0] == b"R" and cur is not None:
                cur.reads.append((int(parts[1]), int(parts[2])))
            elif parts[0] == b"D" and cur is not None:
                cur.load_param = int(parts[1])
                cur.load_model = None if parts[2] == b"None" else int(parts[2])
        if proc.returncode == 0:
            break
        if cur is None:  # died before the first job started
            for r in results[start:]:
                r.crashed = -(proc.returncode or 0)
                r.stderr = (proc.stderr or b"").decode("utf-8", "replace")
            break
        cur.crashed = proc.signal
        cur.stderr = (proc.stderr or b"").decode("utf-8", "replace")
        start = last + 1
    return results


def compare(pred: list[tuple[int, int, str, str]], rec: Recording) -> str | None:
    """None when ncnn made exactly the predicted reads and loaded; else what differs."""
    recd = rec.reads
    for i in range(max(len(pred), len(recd))):
        p = pred[i][:2] if i < len(pred) else None
        r = recd[i] if i < len(recd) else None
        if p != r:
            who = f" ({pred[i][2]}.{pred[i][3]})" if i < len(pred) else ""
            return f"read #{i}: predicted {p}{who}, ncnn read {r}"
    if rec.load_param != 0 or rec.load_model != 0 or rec.crashed:
        return (f"ncnn load_param={rec.load_param} load_model={rec.load_model} "
                f"crashed={rec.crashed}: {rec.stderr.strip()[-300:]}")
    return None


def predicted_reads(graph: "Graph") -> list[tuple[int, int, str, str]]:
    """(offset, size, layer name, role) of every read ncnn makes for `graph`'s attached
    weights, from the schemas and the tags in the file."""
    out = []
    for layer in graph:
        lw = layer.weights
        if lw is None:
            continue
        for w in lw:
            off = w.offset if w.offset is not None else 0
            if w.mode == TAGGED:
                out.append((off, 4, layer.name, w.role))
                off += 4
                sizes = T.payload_reads(w.dtype, w.count)
            elif w.mode == RAW:
                sizes = T.payload_reads(T.RAW, w.count)
            else:
                assert w.mode == PACKED
                sizes = T.payload_reads(T.PACKED, w.count)
            for s in sizes:
                out.append((off, s, layer.name, w.role))
                off += s
    return out


@dataclass
class OracleReport:
    ok: bool
    predicted: int
    recorded: int
    first_mismatch: str | None
    recording: Recording

    def __str__(self) -> str:
        if self.ok:
            return f"ok: {self.recorded} reads equal"
        return f"MISMATCH after {self.predicted}/{self.recorded} reads: {self.first_mismatch}"


def check(param_path: str, bin_path: str, *, graph: "Graph | None" = None,
          allow_trailing: bool = True) -> OracleReport:
    """Compare our predicted reads with ncnn's recorded ones for a param + bin pair."""
    from paramsurgery.formats.io import load

    if graph is None:
        graph = load(param_path, bin=bin_path) if not allow_trailing else _load_trailing(
            param_path, bin_path)
    pred = predicted_reads(graph)
    rec = record_reads(param_path, bin_path)
    mismatch = compare(pred, rec)
    ok = mismatch is None
    recd = rec.reads
    return OracleReport(ok, len(pred), len(recd), mismatch, rec)


def _load_trailing(param_path: str, bin_path: str) -> "Graph":
    from paramsurgery.formats.io import load
    from paramsurgery.formats.weights.binfile import attach_weights

    g = load(param_path)
    attach_weights(g, bin_path, allow_trailing=True)
    return g


def weights_only_param(graph: "Graph") -> str:
    """A text `.param` with only `graph`'s layers that read weights, in order, each with its
    own params and bottom/top counts, fed from one Input. ncnn reads exactly the same bytes
    for it, so it checks graphs ncnn cannot load whole (types ncnn does not have, params its
    load_param rejects in weightless layers)."""
    from paramsurgery.formats.weights.schema import layer_reads

    lines = []
    max_in = 1
    weighted = []
    for layer in graph:
        reads = layer_reads(layer)
        if reads:
            weighted.append(layer)
            max_in = max(max_in, len(layer.inputs))
    ins = [f"in{i}" for i in range(max_in)]
    lines.append(f"Input in 0 {max_in} {' '.join(ins)}")
    nblobs = max_in
    for i, layer in enumerate(weighted):
        outs = [f"l{i}_out{j}" for j in range(len(layer.outputs))]
        nblobs += len(outs)
        params = " ".join(layer.params.tokens())
        lines.append(f"{layer.type} l{i} {len(layer.inputs)} {len(outs)} "
                     f"{' '.join(ins[:len(layer.inputs)])} {' '.join(outs)} {params}")
    return f"7767517\n{len(lines)} {nblobs}\n" + "\n".join(lines) + "\n"
