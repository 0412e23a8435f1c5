"""Progress of long work: the one place that knows how it is shown.

Work that can take seconds (ncnn runs per step, per length, per chunk; weight synthesis;
oracle runs) tells the *current reporter* what it plans and what it finished; it never
prints or imports a progress library itself::

    from paramsurgery.core import progress

    with progress.task("kv-cache parity", total=m + 1, unit="step") as t:
        ...
        t.done("prefill positions 0..7 ... ok")    # one finished item: a line, the bar moves

A library caller gets the silent reporter (nothing printed). The command line installs a
`ConsoleReporter` (`use_console`): plan and item lines go to the command's report stream as
they happen (stdout, line-buffered; stderr when stdout carries a graph), a progress bar
(tqdm) goes to stderr only when stderr is a terminal and neither `--quiet` nor
`--format json` was given, and with `--format json` no line is printed (stdout is the JSON).
A line already shown is not repeated when the final report is printed
(`ConsoleReporter.unshown`), and after SIGTERM/SIGINT `interrupted()` says what was finished.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
from typing import IO, Any, Iterator


class Task:
    """One piece of long work with a known (or unknown: None) number of items."""

    def __init__(self, reporter: "Reporter", desc: str, total: int | None, unit: str) -> None:
        self.reporter, self.desc, self.total, self.unit = reporter, desc, total, unit
        self.count = 0
        self.finished: list[str] = []

    def done(self, line: str | None = None, n: int = 1) -> None:
        """`n` more items are finished; `line` (when given) says which, at once."""
        self.count += n
        if line is not None:
            self.finished.append(line)
        self.reporter._advance(self, line, n)

    def summary(self) -> str:
        total = f" of {self.total}" if self.total is not None else ""
        return f"{self.desc}: {self.count}{total} {self.unit}(s) finished"


class Reporter:
    """The silent reporter (a library call): records, prints nothing."""

    def __init__(self) -> None:
        self.tasks: list[Task] = []
        self._lock = threading.Lock()

    def plan(self, text: str, *, aside: bool = False) -> None:
        """What is about to happen (printed before the work starts); `aside`: on stderr,
        next to a report that keeps stdout (a command's own plan line), and only on a
        terminal."""

    def line(self, text: str) -> None:
        """A finished piece of work that is not an item of a task."""

    @contextlib.contextmanager
    def task(self, desc: str, total: int | None = None, unit: str = "step") -> Iterator[Task]:
        t = Task(self, desc, total, unit)
        with self._lock:
            self.tasks.append(t)
        self._open(t)
        try:
            yield t
        finally:
            self._close(t)

    def interrupted(self) -> list[str]:
        """What was finished, task by task (for a message after a signal)."""
        return [t.summary() for t in self.tasks if t.count or t.total]

    # hooks of the console reporter
    def _open(self, task: Task) -> None:
        pass

    def _advance(self, task: Task, line: str | None, n: int) -> None:
        pass

    def _close(self, task: Task) -> None:
        pass


class ConsoleReporter(Reporter):
    """Lines to `stream` as they happen (None: no lines), a tqdm bar on `bar_stream` when
    `bar` (the caller decides: a terminal, no --quiet, no --format json)."""

    def __init__(self, stream: IO[str] | None, *, bar: bool = False,
                 bar_stream: IO[str] | None = None) -> None:
        super().__init__()
        self.stream = stream
        self.bar = bar
        self.bar_stream = bar_stream if bar_stream is not None else sys.stderr
        self.shown: list[str] = []
        self._bars: dict[int, Any] = {}

    def _write(self, text: str, aside: bool = False) -> None:
        if self.stream is None:
            return
        stream = sys.stderr if aside else self.stream
        if not aside:
            self.shown.append(text)
        if self._bars:
            from tqdm import tqdm

            tqdm.write(text, file=stream)
        else:
            print(text, file=stream)
        stream.flush()

    def plan(self, text: str, *, aside: bool = False) -> None:
        if aside and not self.bar:  # an aside is for a terminal (like the bar): a log or a
            return                  # pipe reads stderr for `file:line: message` alone
        self._write(text, aside)

    def line(self, text: str) -> None:
        self._write(text)

    def redirect(self, stream: IO[str]) -> None:
        """Lines go to `stream` from now on (stderr when stdout carries a graph)."""
        if self.stream is not None:
            self.stream = stream

    def _open(self, task: Task) -> None:
        if self.bar:
            from tqdm import tqdm

            self._bars[id(task)] = tqdm(total=task.total, desc=task.desc, unit=task.unit,
                                        file=self.bar_stream, leave=False, dynamic_ncols=True)

    def _advance(self, task: Task, line: str | None, n: int) -> None:
        if line is not None:
            self._write(line)
        bar = self._bars.get(id(task))
        if bar is not None:
            bar.update(n)

    def _close(self, task: Task) -> None:
        bar = self._bars.pop(id(task), None)
        if bar is not None:
            bar.close()

    def unshown(self, text: str) -> str:
        """`text` without the lines this reporter already printed (each once, in order):
        the final report prints only what the stream has not shown yet."""
        from collections import Counter

        pending = Counter(line.strip() for line in self.shown)
        keep = []
        for line in text.splitlines():
            if pending[line.strip()] > 0:
                pending[line.strip()] -= 1
                continue
            keep.append(line)
        return "\n".join(keep)


_current: contextvars.ContextVar[Reporter | None] = contextvars.ContextVar(
    "paramsurgery_progress", default=None)


def current() -> Reporter:
    """The reporter in force (a fresh silent one for a library call: nothing kept)."""
    return _current.get() or Reporter()


@contextlib.contextmanager
def using(reporter: Reporter) -> Iterator[Reporter]:
    """Make `reporter` the current one within the block."""
    token = _current.set(reporter)  # (a ContextVar: threads and tasks see their own)
    try:
        yield reporter
    finally:
        _current.reset(token)


def plan(text: str, *, aside: bool = False) -> None:
    current().plan(text, aside=aside)


def line(text: str) -> None:
    current().line(text)


def task(desc: str, total: int | None = None, unit: str = "step"
         ) -> contextlib.AbstractContextManager[Task]:
    return current().task(desc, total, unit)


def redirect(stream: IO[str]) -> None:
    """The current reporter's lines go to `stream` (a command writing a graph to stdout)."""
    rep = current()
    if isinstance(rep, ConsoleReporter):
        rep.redirect(stream)


def unshown(text: str) -> str:
    """`text` less the lines the current reporter already printed."""
    rep = current()
    return rep.unshown(text) if isinstance(rep, ConsoleReporter) else text


def use_console(*, stream: IO[str] | None, quiet: bool = False, machine: bool = False
                ) -> contextlib.AbstractContextManager[Reporter]:
    """The command line's reporter: lines on `stream` unless `quiet` or `machine` (JSON
    output), a bar on stderr only on a terminal and neither `quiet` nor `machine`."""
    tty = getattr(sys.stderr, "isatty", lambda: False)()
    return using(ConsoleReporter(None if machine or quiet else stream,
                                 bar=tty and not quiet and not machine))
