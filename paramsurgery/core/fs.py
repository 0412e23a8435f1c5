"""Atomic file writes and reading input files: the file-system layer under every format.

Every output is written to a temporary file in the destination directory and renamed over
the target only when complete, so a failure never leaves a partial file and an existing
output is replaced only on success. The temporary file is removed on any failure,
including SIGINT, SIGTERM and SIGHUP (which are turned into `Terminated` while a write is
under way). A write that fails (no such directory, disk full, read-only, permission) is a
`ParamSurgeryError` naming the path: `out.param: cannot write: No space left on device`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import tempfile
import threading
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping

from paramsurgery.core.errors import ParamSurgeryError, cannot_open

# callbacks told the path of every file just renamed into place (`--report` watches which
# graphs a command wrote: paramsurgery.view.report)
WRITE_WATCHERS: list[Callable[[str], None]] = []


def _written(path: str | os.PathLike) -> None:
    for watcher in WRITE_WATCHERS:
        watcher(os.fspath(path))


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived; raised like KeyboardInterrupt so cleanups run."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by signal {signum}")
        self.signum = signum


_CLEANUP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Within the block, SIGTERM/SIGHUP raise `Terminated` (as SIGINT raises
    KeyboardInterrupt) so `finally` clauses remove temporary files. Only the main thread can
    set handlers, and a handler the program installed itself is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {}
    for sig in _CLEANUP_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            saved[sig] = signal.signal(sig, _raise_terminated)
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def write_error(path: str | os.PathLike, exc: OSError) -> ParamSurgeryError:
    """`path: cannot write: <reason>` for an OSError met while writing `path`."""
    return ParamSurgeryError(f"cannot write: {exc.strerror or exc}", file=os.fspath(path))


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _stage(path: Path) -> tuple[int, str]:
    directory = path.parent if str(path.parent) else Path(".")
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "Is a directory")
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise write_error(path, exc) from None


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary sibling of `path` for writing; rename it over `path` on success."""
    path = Path(path)
    with signals_raise():
        fd, tmp = _stage(path)
        try:
            try:
                with os.fdopen(fd, mode) as fh:
                    yield fh
                    fh.flush()
                    os.fsync(fh.fileno())
                try:
                    mode_bits = os.stat(path).st_mode & 0o777
                except FileNotFoundError:
                    mode_bits = _default_mode()
                os.chmod(tmp, mode_bits)
                os.replace(tmp, path)
                _written(path)
            except OSError as exc:
                raise write_error(path, exc) from None
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    with atomic_open(path, "wb") as fh:
        fh.write(data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data)


def atomic_write_many(writers: Mapping[str | os.PathLike, Callable[[IO], object]]) -> None:
    """Write several files; all are renamed into place only after every one was written."""
    staged: list[tuple[str, Path]] = []
    with signals_raise():
        try:
            for path, write in writers.items():
                path = Path(path)
                fd, tmp = _stage(path)
                staged.append((tmp, path))
                try:
                    with os.fdopen(fd, "wb") as fh:
                        write(fh)
                        fh.flush()
                        os.fsync(fh.fileno())
                except OSError as exc:
                    raise write_error(path, exc) from None
            mode_bits = _default_mode()
            for tmp, path in staged:
                try:
                    os.chmod(tmp, mode_bits)
                    os.replace(tmp, path)
                    _written(path)
                except OSError as exc:
                    raise write_error(path, exc) from None
            staged = []
        finally:
            for tmp, _ in staged:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)


# A `.param` from a pipe or a device is read up to this many bytes (`/dev/zero` never ends).
MAX_STREAM_BYTES = 64 << 20


def read_bytes(path: str | os.PathLike) -> bytes:
    """A file's bytes; a non-regular file (pipe, device) is read up to MAX_STREAM_BYTES."""
    path_s = os.fspath(path)
    try:
        with open(path_s, "rb") as fh:
            if stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return fh.read()
            data = fh.read(MAX_STREAM_BYTES + 1)
    except OSError as exc:
        raise ParamSurgeryError(cannot_open(exc), file=path_s) from None
    if len(data) > MAX_STREAM_BYTES:
        raise ParamSurgeryError(f"not a regular file and longer than {MAX_STREAM_BYTES} bytes",
                                file=path_s)
    return data


def companion(path: str | os.PathLike, *endings: tuple[str, str]) -> str | None:
    """A file kept next to `path` (pnnx's IR, the weights, ...): for each `(ending,
    replacement)` that `path` ends with, in order, `path` with it replaced, the first that
    is an existing file other than `path`."""
    p = os.fspath(path)
    for ending, replacement in endings:
        if p.endswith(ending):
            cand = p[: len(p) - len(ending)] + replacement
            if cand != p and os.path.isfile(cand):
                return cand
    return None
