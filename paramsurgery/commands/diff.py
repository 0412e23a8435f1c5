"""`paramsurgery diff`: semantic diff of two graphs: layers added, removed, renamed, changed

Pair the layers of A and B by name, then by structure where names changed (same type
reading the same blobs), and list what was added, removed, renamed and changed (type, params
by value, bottoms, tops; weights by content hash when both .bin files are given). Exit 0 when
the graphs are the same, 1 when they differ, 2 on bad input.
"""

from __future__ import annotations

import argparse

from paramsurgery.commands._common import (add_format_arg, add_input_arg, command, file_list,
                                           print_json)


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, __doc__, run)
    add_input_arg(p, "the first .param", "a")
    add_input_arg(p, "the second .param", "b")
    p.add_argument("--bin-a", "--bin", dest="bin_a", metavar="BIN",
                   help="A's weights (compare weights by hash; --bin is the same)")
    p.add_argument("--bin-b", metavar="BIN", help="B's weights")
    p.add_argument("--html", metavar="PAGE", help="also write both graphs side by side with "
                   "the changes coloured")
    add_format_arg(p)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.core.errors import ParamSurgeryError
    from paramsurgery.core.fs import atomic_write
    from paramsurgery.formats.io import load
    from paramsurgery.view.diff import diff_graphs

    if bool(args.bin_a) != bool(args.bin_b):
        raise ParamSurgeryError("give both --bin-a and --bin-b (or neither)",
                                file=args.a if not args.bin_a else args.b)
    a = load(args.a, bin=args.bin_a)
    b = load(args.b, bin=args.bin_b)
    d = diff_graphs(a, b, a_path=args.a, b_path=args.b)
    if args.html:
        from paramsurgery.view.page import diff_page

        atomic_write(args.html, diff_page(a, b, d))
    if args.format == "json":
        print_json({**d.to_json(), "files": file_list(("a", args.a), ("b", args.b))})
    else:
        print(d.format())
        if args.html:
            print(f"wrote {args.html}")
    return 0 if d.same else 1
