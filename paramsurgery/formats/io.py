"""Loading and saving graphs: the file formats chosen by a file's magic or name."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from paramsurgery.core.errors import ParamSyntaxError
from paramsurgery.core.fs import atomic_write, atomic_write_many, read_bytes

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph


def read_graph(data: bytes, path: str | None = None) -> "Graph":
    """A `.param` (text) or `.param.bin` (binary, recognised by its magic) from its bytes."""
    from paramsurgery.formats.param_bin import read_param_bin
    from paramsurgery.formats.param_text import BINARY_MAGIC, read_param

    if data[:4] == BINARY_MAGIC:
        return read_param_bin(data, path)
    return read_param(data, path)


def load(path: str | os.PathLike, bin: str | os.PathLike | None = None) -> "Graph":
    """Load a `.param` (text) or `.param.bin` (binary, recognised by its magic) and, when
    `bin` is given, its weights with exact byte accounting."""
    path_s = os.fspath(path)
    data = read_bytes(path_s)
    try:
        g = read_graph(data, path_s)
    except ParamSyntaxError:
        if path_s.endswith(".bin") and not path_s.endswith(".param.bin"):
            raise ParamSyntaxError("this is a weights file (.bin), not a graph: give its "
                                   ".param (and this file with --bin)", file=path_s) from None
        raise
    if bin is not None:
        from paramsurgery.formats.weights import attach_weights

        attach_weights(g, bin)
    return g


def loads(text: str | bytes, name: str | None = None) -> "Graph":
    """Parse `.param` text given as a string (or bytes)."""
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    return read_graph(data, name)


def param_bytes(g: "Graph", path: str | os.PathLike) -> bytes:
    """The graph as the file `path` names: binary for `.param.bin` (what ncnn's
    `load_param_bin` reads), else text (also for `-`, stdout)."""
    if os.fspath(path).endswith(".param.bin"):
        from paramsurgery.formats.param_bin import write_param_bin

        return write_param_bin(g)
    from paramsurgery.formats.param_text import dump_bytes

    return dump_bytes(g)


def names_file(g: "Graph", path: str | os.PathLike) -> tuple[str, bytes] | None:
    """The file that keeps the names of a `.param.bin` (which stores none): `x.id.h`
    beside `x.param.bin`, ncnn2mem's format, read back when `x.param.bin` is loaded.
    None for a text `.param` (and stdout)."""
    path_s = os.fspath(path)
    if not path_s.endswith(".param.bin"):
        return None
    from paramsurgery.formats.param_bin import id_h_path, write_id_h

    stem = os.path.basename(path_s)[: -len(".param.bin")]
    return id_h_path(path_s), write_id_h(g, stem)


def save(g: "Graph", path: str | os.PathLike, bin: str | os.PathLike | None = None) -> None:
    """Write the `.param` (text, or binary if the path ends in `.param.bin`, with its names
    in `x.id.h` beside it) atomically, and the `.bin` too when a path is given and weights
    are loaded."""
    path_s = os.fspath(path)
    data = param_bytes(g, path_s)
    names = names_file(g, path_s)
    if bin is None and names is None:
        atomic_write(path_s, data)
        return
    files = {path_s: lambda fh: fh.write(data)}
    if names is not None:
        files[names[0]] = lambda fh: fh.write(names[1])
    if bin is not None:
        from paramsurgery.formats.weights import write_weights

        files[os.fspath(bin)] = lambda fh: write_weights(g, fh)
    atomic_write_many(files)
