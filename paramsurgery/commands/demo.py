"""`paramsurgery demo`: the main job on the bundled tiny Qwen3-TTS talker decoder (or PARAM)

The main job, end to end, on the bundled tiny Qwen3-TTS talker decoder (or PARAM): lint
(static rules, plus a run through ncnn when pnnx's files or a reference are next to the
file; it says when no run was made), info, validate, a byte-identical round trip loaded back
by ncnn, add-kvcache, and a kv-cache parity check through ncnn at lengths no trace used
(needs the weights). A step that cannot be done is said so, never claimed. Exit 1 when a
check fails.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from paramsurgery.commands._common import (add_format_arg, add_input_arg, add_weights_arg,
                                               command)

    p = command(sub, __doc__, run)
    add_input_arg(p, "use this .param instead of the bundled one", nargs="?")
    add_weights_arg(p, "PARAM's weights (default: the .bin beside it)")
    add_format_arg(p)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.demo import run_demo

    if args.format == "text":
        return run_demo(args.param, args.bin)
    import contextlib
    import io

    from paramsurgery.commands._common import print_json

    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        code = run_demo(args.param, args.bin)
    steps: list[dict] = []
    for line in log.getvalue().splitlines():
        if line.startswith("== "):
            number, _, title = line[3:].partition(". ")
            steps.append({"step": int(number), "title": title, "ok": True, "lines": []})
        elif steps and line:
            steps[-1]["lines"].append(line)
            if line.startswith("FAILED"):
                steps[-1]["ok"] = False
    print_json({"ok": code == 0, "steps": steps,
                "files": [{"file": args.param or "<bundled>", "role": "input"}]})
    return code
