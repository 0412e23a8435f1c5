"""`paramsurgery demo`: run the main job on the bundled default graph."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="the main job on the bundled tiny Qwen3-TTS talker decoder (or PARAM)",
        description="The main job, end to end, on the bundled tiny Qwen3-TTS talker decoder "
                    "(or PARAM): lint (static rules, plus a run through ncnn when pnnx's "
                    "files or a reference are next to the file; it says when no run was "
                    "made), info, validate, a byte-identical round trip loaded back by ncnn, "
                    "add-kvcache, and a kv-cache parity check through ncnn at lengths no "
                    "trace used (needs the .bin next to the file). A step that cannot be "
                    "done is said so, never claimed. Exit 1 when a check fails.")
    p.add_argument("param", nargs="?", help="use this .param instead of the bundled one")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.demo import run_demo

    return run_demo(args.param)
