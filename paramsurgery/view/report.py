"""`--report PAGE` for every graph-writing command: the before/after page of what it did.

One mechanism for all commands: `add_report_arg` (called where the output arguments are
added) declares the flag, and the CLI runs a command given `--report` through
`run_with_report`, which keeps the input graph as it was before the command ran (so
`--in-place` is covered), watches which `.param` files the command writes (every output
goes through `paramsurgery.formats.io`'s atomic writers, which tell the watchers; the first graph is
read as soon as it is written, so outputs staged and moved later count too), and afterwards
draws the input and that graph side by side with the semantic diff. A command
that fails writes no report; a report is written atomically like every output.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from paramsurgery.core.errors import ParamSurgeryError

GRAPH_SUFFIXES = (".param", ".param.bin")


def add_report_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--report", metavar="PAGE",
                        help="also write an HTML page with the graph before and after, the "
                             "changes coloured (see `paramsurgery diff`)")


def run_with_report(args: argparse.Namespace, run: Callable[[argparse.Namespace], int]) -> int:
    from paramsurgery.core import fs
    from paramsurgery.core.fs import atomic_write
    from paramsurgery.formats.io import load, loads
    from paramsurgery.view.diff import diff_graphs
    from paramsurgery.view.page import diff_page

    report = args.report
    source = getattr(args, "param", None)
    if not source:
        raise ParamSurgeryError("--report needs a command that reads a .param")
    if getattr(args, "output", None) == "-":
        raise ParamSurgeryError("--report needs the graph written to a file, not to stdout (-o -)",
                                file=source)
    if os.path.exists(report) and any(os.path.exists(p) and os.path.samefile(report, p)
                                      for p in (source, getattr(args, "bin", None) or "")):
        raise ParamSurgeryError("--report names an input file", file=source)
    out = getattr(args, "output", None)
    if out and os.path.abspath(out) == os.path.abspath(report):
        raise ParamSurgeryError("--report names the output file", file=source)
    before = load(source)
    graphs: list[tuple[str, bytes]] = []

    def keep_graph(path: str) -> None:
        # read at once: a command may stage its outputs and move them afterwards
        if not graphs and path.endswith(GRAPH_SUFFIXES):
            graphs.append((path, fs.read_bytes(path)))

    fs.WRITE_WATCHERS.append(keep_graph)
    try:
        code = run(args)
    finally:
        fs.WRITE_WATCHERS.remove(keep_graph)
    if code != 0:
        return code
    if graphs:
        path, data = graphs[0]
        if not os.path.exists(path):  # staged: name it by its file name
            path = os.path.basename(path)
        after = loads(data, path)
    else:
        path, after = "(nothing written)", before
    d = diff_graphs(before, after, a_path=source, b_path=path)
    title = f"{args.command}: {source} -> {path}"
    atomic_write(report, diff_page(before, after, d, title=title))
    if getattr(args, "format", "text") == "text":
        print(f"wrote {report} ({len(d.added)} added, {len(d.removed)} removed, "
              f"{len(d.changed)} changed, {len(d.renamed)} renamed)")
    else:
        print(f"wrote {report}", file=sys.stderr)
    return code
