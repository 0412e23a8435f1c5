"""`paramsurgery reduce`: shrink a failing graph to a minimal one that still fails."""

from __future__ import annotations

import argparse
import os
import sys

from paramsurgery.commands._common import add_format_arg, file_list, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reduce", help="shrink a failing graph to a minimal one that still fails",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Shrink a graph that fails (crashes ncnn, fails to load, or computes something different
from a reference graph) to a minimal graph that still fails: bisect from the outputs side,
then from the inputs side (cut blobs become Input layers fed with the values they had in
a full run), then remove single layers until none can go. Weights stay byte-exact.

Writes OUT/reduced.param (+ .bin, + .inputs.npz), the smallest failing graph;
OUT/passing.param (+ .bin, + .inputs.npz), the largest graph tried that passed; and
OUT/replay.json, every candidate with its verdict (--replay reuses them).

What fails (one of):
  --check "CMD {param} {bin}"   a command; fails when it exits non-zero (or with a
                                --fail-code; negative = killed by that signal). Also
                                {inputs} (npz of input values), {expected}, {dir}.
  --predicate mod:fn            fn(candidate) -> True when it still fails; mod may be a
                                path/to/file.py. See paramsurgery.repro.reduce.Candidate.
  --fails KIND                  run through ncnn in a child process: crash, load-error,
                                mismatch (needs --reference) or any.

exit: 0 reduced, 1 the source graph does not fail, 2 usage or input error.""")
    p.add_argument("param", help="the failing .param")
    from paramsurgery.commands._common import add_weights_arg

    add_weights_arg(p, "its .bin (kept byte-exact in the outputs); without it ncnn runs with "
                       "zero weights", positional=True)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", metavar="CMD", help="command template (no shell)")
    what.add_argument("--predicate", metavar="MOD:FN", help="Python predicate")
    what.add_argument("--fails", choices=("crash", "load-error", "mismatch", "any"),
                      help="built-in ncnn check")
    p.add_argument("--inputs", metavar="NPZ",
                   help="values of the graph inputs (keys = blob names, optional "
                        "batch_index_<blob>; a repro ref.npz works)")
    p.add_argument("--reference", metavar="PARAM", help="graph with the right values (mismatch)")
    p.add_argument("--reference-bin", metavar="BIN", help="its .bin")
    p.add_argument("--fail-code", type=int, action="append", default=[], metavar="N",
                   help="--check exit codes that count as the failure (repeatable)")
    p.add_argument("--fail-regex", metavar="RE",
                   help="the failure's output must match (stdout+stderr of --check, ncnn's "
                        "messages for --fails)")
    p.add_argument("--mode", choices=("bisect", "linear"), default="bisect",
                   help="bisect (default), or one layer at a time (slow, robust)")
    p.add_argument("--compare", choices=("outputs", "all"), default="outputs",
                   help="mismatch: compare the candidate's outputs (default) or every blob it "
                        "computes that the reference has (finds a difference the outputs "
                        "hide, e.g. with zero weights)")
    p.add_argument("--atol", type=float, default=1e-3, help="mismatch tolerance (default 1e-3)")
    p.add_argument("--rtol", type=float, default=1e-3, help="mismatch tolerance (default 1e-3)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds per check run (default 600)")
    p.add_argument("--replay", metavar="JSON", help="reuse the verdicts of an earlier replay.json")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="output directory (default: <param>.reduce/)")
    add_format_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from paramsurgery.core.errors import ParamSurgeryError
    from paramsurgery.repro.reduce import (BuiltinCheck, Check, CommandCheck, SourcePasses, Step,
                                           load_predicate, reduce_graph)

    check: Check
    if args.check is not None:
        check = CommandCheck(args.check, fail_codes=args.fail_code, fail_regex=args.fail_regex,
                             timeout=args.timeout)
    elif args.predicate is not None:
        check = load_predicate(args.predicate)
    else:
        check = BuiltinCheck(args.fails, atol=args.atol, rtol=args.rtol, timeout=args.timeout,
                             fail_regex=args.fail_regex, compare=args.compare)
    if args.fail_code and args.check is None:
        raise ParamSurgeryError("--fail-code applies to --check only")
    if args.reference_bin and not args.reference:
        raise ParamSurgeryError("--reference-bin needs --reference")
    out = args.output or (args.param[:-len(".param")] if args.param.endswith(".param")
                          else args.param) + ".reduce"
    if os.path.exists(out) and not os.path.isdir(out):
        raise ParamSurgeryError("-o must name a directory", file=out)

    quiet = args.quiet or args.format == "json"

    def progress(step: Step) -> None:
        if not quiet:
            mark = " (replayed)" if step.replayed else ""
            print(f"[{step.n:3d}] {step.phase:<15} {step.layers:5d} layers  "
                  f"{step.result:<7} {step.seconds:6.2f}s  {step.detail[:90]}{mark}",
                  file=sys.stderr)

    def note(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr)

    try:
        res = reduce_graph(args.param, args.bin, check, out_dir=out, inputs=args.inputs,
                           reference=args.reference, reference_bin=args.reference_bin,
                           mode=args.mode, replay=args.replay, timeout=args.timeout,
                           progress=progress, note=note)
    except SourcePasses as exc:
        print(f"{args.param}: {exc.message}", file=sys.stderr)
        return 1
    r = res.result
    failing = r.failing
    summary = {
        "source_layers": r.source_layers, "reduced_layers": failing.layers,
        "reduced_layer_names": failing.layer_names(),
        "reduced_inputs": failing.inputs, "reduced_outputs": failing.outputs,
        "verdict": r.failing_verdict.detail,
        "passing_layers": r.passing.layers if r.passing else None,
        "runs": r.runs, "steps": len(r.steps), "seconds": round(r.seconds, 2),
        "weights_layers_checked": res.weights_checked,
        "files": file_list(("input", args.param), ("weights", args.bin), *res.files.items()),
    }
    if args.format == "json":
        print_json(summary)
        return 0
    print(f"reduced {r.source_layers} -> {failing.layers} layers "
          f"({', '.join(f'{layer.type} {layer.name}' for layer in failing.graph if layer.type != 'Input')}) "
          f"in {r.runs} runs, {r.seconds:.1f} s: {r.failing_verdict.detail}")
    print(f"  smallest failing: {res.files['reduced_param']}"
          + (f" + {res.files['reduced_bin'].name}" if "reduced_bin" in res.files else ""))
    if r.passing is not None:
        print(f"  largest passing:  {res.files['passing_param']} ({r.passing.layers} layers)")
    if res.weights_checked is not None:
        print(f"  weights: {res.weights_checked} layers byte-identical to the source")
    print(f"  replay log:       {res.files['replay']}")
    return 0
