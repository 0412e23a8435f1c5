"""Loading and saving graphs, and atomic file writes.

Every output is written to a temporary file in the destination directory and renamed over
the target only when complete, so a failure never leaves a partial file and an existing
output is replaced only on success.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Iterator

from .errors import ParamSurgeryError

if TYPE_CHECKING:
    from .graph import Graph

# callbacks told the path of every file just renamed into place (`--report` watches which
# graphs a command wrote: paramsurgery.view.report)
WRITE_WATCHERS: list[Callable[[str], None]] = []


def _written(path: str | os.PathLike) -> None:
    for watcher in WRITE_WATCHERS:
        watcher(os.fspath(path))


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary sibling of `path` for writing; rename it over `path` on success."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        try:
            mode_bits = os.stat(path).st_mode & 0o777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode_bits = 0o666 & ~umask
        os.chmod(tmp, mode_bits)
        os.replace(tmp, path)
        _written(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    with atomic_open(path, "wb") as fh:
        fh.write(data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data)


def atomic_write_many(writers: dict[str | os.PathLike, Callable[[IO], None]]) -> None:
    """Write several files; all are renamed into place only after every one was written."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, write in writers.items():
            path = Path(path)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                                       dir=path.parent if str(path.parent) else Path("."))
            staged.append((tmp, path))
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        for tmp, path in staged:
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, path)
            _written(path)
        staged = []
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def read_bytes(path: str | os.PathLike) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise ParamSurgeryError("no such file", file=os.fspath(path)) from None
    except IsADirectoryError:
        raise ParamSurgeryError("is a directory, not a file", file=os.fspath(path)) from None
    except PermissionError:
        raise ParamSurgeryError("permission denied", file=os.fspath(path)) from None


def load(path: str | os.PathLike, bin: str | os.PathLike | None = None) -> "Graph":
    """Load a `.param` (text) or `.param.bin` (binary, recognised by its magic) and, when
    `bin` is given, its weights with exact byte accounting."""
    from .formats.param_text import read_param

    path_s = os.fspath(path)
    g = read_param(read_bytes(path_s), path_s)
    if bin is not None:
        from .weights import attach_weights

        attach_weights(g, bin)
    return g


def loads(text: str | bytes, name: str | None = None) -> "Graph":
    """Parse `.param` text given as a string (or bytes)."""
    from .formats.param_text import read_param

    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    return read_param(data, name)


def save_graph(g: "Graph", path: str | os.PathLike, bin: str | os.PathLike | None = None) -> None:
    path_s = os.fspath(path)
    if path_s.endswith(".param.bin"):
        from .formats.param_bin import write_param_bin

        data = write_param_bin(g)
    else:
        data = g.dump_bytes()
    if bin is None:
        atomic_write(path_s, data)
        return
    from .weights import write_weights

    atomic_write_many({path_s: lambda fh: fh.write(data),
                       os.fspath(bin): lambda fh: write_weights(g, fh)})
