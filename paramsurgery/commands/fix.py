"""`paramsurgery fix FILE`: lint, run every repair pass the findings call for, re-lint, write.

The plan is data: each lint finding names the pass that repairs it (`Finding.fix_pass`, set
by its rule or check), and each pass declares in its own file whether `fix` may run it
(`repair_order`), how (`for_fix`) and which converter leftovers it claims (`claims`, what
lint's PS004 names as the fix). The passes run in a `PassManager`; one that refuses is
rolled back and its reason printed, the others still apply. A repair can make another
finding visible: the plan is rebuilt from the new findings until no new pass is called for
(each pass runs at most once). A pass's extra inputs are its own declaration
(`Pass.fix_inputs`, e.g. dynamize's `--pair`), exposed here as flags and handed over in the
`RepairContext` with the input's `--bin`, its reference and `repaired_like` (another export
after the repairs applied so far, so a pass compares like with like).

With `--bin`, the weights are loaded (and checked against the graph) and the output gets
its `.bin` next to it: rewritten when a repair changed the weighted layers, else a hard link
(or copy) of the input's. `--verify` runs the result through ncnn (child process) against a
torch reference (`X.ref.npz` next to the input, or `--reference`).

What is left afterwards is nothing, or findings no pass repairs (listed, exit 1), or
refusals (exit 2).

`--kvcache` (a decoder): once `fix` exited 0, `add-kvcache --verify` on its result (the
export itself when nothing needed fixing) — each step's own report in turn — proven through
ncnn: a prefill plus single-token steps against a full prefill of the fixed graph, fed by
the inputs' shapes with the length symbolic that dynamize derived (`length_spec`). Without
them (no static trace dynamized) it refuses, naming the add-kvcache command to run.
"""

from __future__ import annotations

import argparse
import os
import sys

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.ir.graph import Graph
from paramsurgery.passes.base import PassResult, repairs
from paramsurgery.pipeline.fix import FixReport, fix_graph, fix_inputs
from paramsurgery.commands._common import add_output_args
from paramsurgery.commands._runner import (Check, GraphCommand, Outputs, PassLike, Run, Writer, add_bin_arg,
                                           add_pnnx_arg, add_verify_args, traced_path)


def register(sub: argparse._SubParsersAction) -> None:
    names = ", ".join(p.name for p in repairs())
    p = sub.add_parser("fix", help=f"lint, then run every repair pass the findings call for "
                                   f"({names})")
    p.add_argument("param", help="input .param")
    add_output_args(p, "output .param (default: <input>.fixed.param)")
    add_bin_arg(p)
    add_pnnx_arg(p)
    for flag, inp in fix_inputs().items():
        p.add_argument(flag, dest=inp.name, type=inp.type, metavar=inp.metavar,
                       help=inp.help)
    add_verify_args(p, "run the result through ncnn against a torch reference (needs --bin; "
                       "X.ref.npz next to the input or --reference)", tol=1e-4)
    p.add_argument("--reference", metavar="NPZ",
                   help="the torch reference (.npz; default: X.ref.npz next to the input): "
                        "what --verify compares with, and the length a static export is "
                        "dynamized to when its inputs are the traced ones at another length")
    p.add_argument("--always-write", action="store_true",
                   help="write the output even when nothing changed (a copy of the input) or "
                        "errors are left that no repair handles (then exit 1); without it "
                        "nothing is written in both cases")
    p.add_argument("--kvcache", action="store_true",
                   help="then add-kvcache --verify on the fixed graph (X.fixed.kvcache.param): "
                        "the cache proven through ncnn (prefill + single steps vs a full "
                        "prefill); needs --bin")
    run.finish(p, explain="also list what each pass left alone")
    p.set_defaults(run=_fix_then_kvcache)


class _FixAll:
    """`fix_graph` in the runner's shape: graph in, one PassResult out (the report in
    `data["report"]`)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.traced = traced_path(args)

    def __call__(self, g: Graph) -> PassResult:
        from paramsurgery.formats.pnnx_reference import find_reference

        args = self.args
        options = {inp.name: getattr(args, inp.name, None) for inp in fix_inputs().values()}
        for inp in fix_inputs().values():  # a missing file is an input error, before any work
            value = options[inp.name]
            if inp.path and value is not None and not os.path.isfile(value):
                raise ParamSurgeryError(f"{inp.flag}: no such file", file=value)
        rep = fix_graph(g, traced=self.traced, param=args.param, bin=args.bin,
                        reference=args.reference or find_reference(args.param),
                        options=options)
        # the symbolic input shapes dynamize derived: what --kvcache's proof is fed
        args.length_inputs = next((r.data["length_spec"].inputs for r in rep.results
                                   if "length_spec" in r.data), None)
        return PassResult(rep.graph, rep.modified,
                          [c for r in rep.results for c in r.changes],
                          [s for r in rep.results for s in r.skipped], pass_name="fix",
                          data={"report": rep})


def _report(run: Run) -> FixReport:
    return run.result.data["report"]


class FixCommand(GraphCommand):
    tag, bin_note = "fixed", True
    refusal = "the repaired graph does not match the reference"

    def make_pass(self, args: argparse.Namespace) -> PassLike:
        return _FixAll(args)

    def summary(self, run: Run) -> list[str]:
        rep, explain = _report(run), run.args.explain
        lines = [f"{len(rep.before)} finding(s); repairs called for: "
                 f"{', '.join(rep.wanted) or 'none'}"]
        lines += [r.format(explain) for r in rep.results]
        lines += [f"{name}: refused (rolled back): {msg}" for name, msg in rep.failures]
        lines += [f"not repaired ({f.fix_pass} left it; --explain says why): "
                  f"{f.format(run.args.param)}" for f in rep.fixable_left]
        lines += [f"not repairable here: {f.format(run.args.param)}" for f in rep.unrepairable]
        return lines

    def json(self, run: Run) -> dict:
        rep = _report(run)
        return {"findings_before": [f.to_json() for f in rep.before],
                "passes": [{"pass": r.pass_name, "modified": r.modified,
                            "changes": [c.__dict__ for c in r.changes]} for r in rep.results],
                "refused": [{"pass": n, "reason": m} for n, m in rep.failures],
                "findings_after": [f.to_json() for f in rep.after],
                "weights": run.bin_note,
                "verify": None if run.check is None else run.check.to_json()}

    def checks(self, run: Run) -> bool:
        return True  # `verify` decides: a reference next to the input is used unasked

    def verify(self, run: Run, staged: Outputs) -> Check | None:
        """The repaired graph against the torch reference (a raw export may not load at all,
        so the reference is torch's numbers, not the input graph)."""
        from paramsurgery.formats.pnnx_reference import find_reference
        from paramsurgery.verify.reference import verify_against_reference

        args = run.args
        # a static export dynamized to the reference's length computes something new at that
        # length: proven against the reference whether --verify was given or not
        dynamized = any("length_spec" in r.data for r in _report(run).results)
        # a mask rebuilt from the run-time lengths (pnnx's dynamic export: causal-mask on the
        # mask built in the graph) is proven against a reference next to the input by default
        derived = any(r.data.get("length_derived") for r in _report(run).results)
        ref = args.reference or find_reference(args.param)
        if not (args.verify or dynamized or (derived and ref is not None)):
            # any other change, with a torch reference next to the input (or given) and the
            # weights: run through ncnn against it before anything is written, asked or not
            # (issue 24: a repair that computes something else is refused, exit 1, not written)
            if ref is None or staged.bin is None or not run.result.modified:
                return None
        if ref is None:
            raise ParamSurgeryError("--verify needs a torch reference: X.ref.npz next to the input "
                                    "or --reference REF.npz", file=args.param)
        # a static export dynamized from a pair runs at the reference's length as well: its
        # inputs are paired with the arrays like a single-trace dynamize's (pnnx's traced shapes
        # are of the first trace's length)
        resized = any(r.pass_name == "dynamize" and r.modified for r in _report(run).results)
        if dynamized or (resized and not args.verify):
            if staged.bin is None:
                from paramsurgery.core.fs import companion

                staged.bin = companion(args.param, (".param", ".bin"), (".param.bin", ".bin"))
            if staged.bin is None:
                raise ParamSurgeryError(f"dynamized to the length of {ref}, which only a run "
                                        f"through ncnn proves: give the weights (--bin)",
                                        file=args.param)
            return _verify_other_length(run, staged, os.fspath(ref))
        if staged.bin is None and derived and not args.verify:
            from paramsurgery.core.fs import companion

            staged.bin = companion(args.param, (".param", ".bin"), (".param.bin", ".bin"))
            if staged.bin is None:
                raise ParamSurgeryError(f"a mask rebuilt from the run-time lengths is proven against "
                                        f"{ref} through ncnn: give the weights (--bin)",
                                        file=args.param)
        return verify_against_reference(staged.param, staged.bin, os.fspath(ref), graph=run.graph,
                                        pnnx=args.pnnx or None, source=args.param, tol=args.tol)

    def unproven(self, run: Run) -> str | None:
        """fix proves against torch's numbers, not the input graph (a raw export may not load):
        without a reference or the weights no check ran, and the line says which was missing."""
        from paramsurgery.formats.pnnx_reference import find_reference

        if not run.result.modified or run.check is not None:
            return None
        args = run.args
        ref = args.reference or find_reference(args.param)
        if ref is None:
            p = args.param
            stem = next((p[: -len(ext)] for ext in (".ncnn.param", ".param") if p.endswith(ext)), p)
            return (f"no torch reference ({stem}.ref.npz next to the input, or --reference "
                    f"REF.npz): the repaired graph was not run through ncnn against torch's "
                    f"numbers; with one and the weights (--bin), fix proves it before writing "
                    f"(exit 1, nothing written, on a mismatch)")
        return (f"no weights (--bin model.bin): the repaired graph was not run through ncnn "
                f"against {ref}; with them, fix proves it before writing")

    def refuse(self, run: Run) -> tuple[int, str] | None:
        """A repair refused, or errors are left that no repair handles: nothing is written
        (exit 2), unless `--always-write` asks for the partly repaired graph (exit 1)."""
        rep = _report(run)
        if rep.failures:
            names = ", ".join(dict.fromkeys(name for name, _ in rep.failures))
            return 2, f"{len(rep.failures)} repair(s) refused ({names}; rolled back, see above)"
        left = rep.errors_left
        if left and not run.args.always_write:
            where = "; ".join(f"{f.code} {f.layer or 'header'}" +
                              (f" (line {f.line})" if f.line else "") for f in left[:5])
            more = f" and {len(left) - 5} more" if len(left) > 5 else ""
            return 2, (f"{len(left)} error(s) no repair handles: {where}{more} (--always-write "
                       f"writes the partly repaired graph)")
        return None

    def write(self, run: Run, writers: dict[str, Writer]) -> str | None:
        if not (run.result.modified or run.args.always_write):
            return "nothing to change; no file written (--always-write writes a copy)"
        return super().write(run, writers)

    def report(self, run: Run, *, written: bool = True, note: str | None = None) -> int:
        """Refusals, then every error left, located (`file:line: CODE ...`), on stderr
        whatever the format; the report; exit 1 when errors are left."""
        rep = _report(run)
        for line in rep.located + [f"{f.format(run.args.param)}" for f in rep.errors_left]:
            print(line, file=sys.stderr)
        super().report(run, written=written, note=note)
        return 1 if rep.errors_left else rep.exit_code


run = FixCommand()


def _verify_other_length(run: Run, staged: Outputs, ref: str) -> Check:
    """A static export dynamized to the reference's length: pnnx's traced shapes no longer
    pair the arrays with the blobs, so they are paired in order (and the batch axes read
    from the repaired graph) in a blob-keyed copy."""
    import tempfile

    from paramsurgery.core.npz import write_npz
    from paramsurgery.passes.dynamize_shapes import blob_keyed_reference
    from paramsurgery.verify.reference import verify_against_reference

    with tempfile.TemporaryDirectory(prefix="paramsurgery-fix-ref-") as tmp:
        keyed = os.path.join(tmp, "ref.npz")
        write_npz(keyed, blob_keyed_reference(ref, run.graph))
        check = verify_against_reference(staged.param, staged.bin, keyed, graph=run.graph,
                                         tol=run.args.tol)
    check.reference = ref
    return check


def _fix_then_kvcache(args: argparse.Namespace) -> int:
    """`fix`, then (`--kvcache`, fix exited 0) `add-kvcache --verify` on what it gave."""
    if not getattr(args, "kvcache", False):
        return run(args)
    if args.format == "json" or args.output == "-" or getattr(args, "in_place", False):
        raise ParamSurgeryError("--kvcache writes two files and prints two text reports: "
                                "give -o FILE (not '-' or --in-place) and no --format json",
                                file=args.param)
    if not args.bin:
        raise ParamSurgeryError("--kvcache proves the cache through ncnn: give the weights "
                                "(--bin)", file=args.param)
    code = run(args)
    if code != 0:
        print(f"kvcache: not run (fix exited {code})")
        return code
    from paramsurgery.commands import add_kvcache
    from paramsurgery.core.fs import companion

    out = run.outputs(args)
    fixed = out.param if os.path.isfile(out.param) else args.param  # nothing to change
    fixed_bin = (out.bin if fixed == out.param else args.bin) or \
        companion(fixed, (".param", ".bin"), (".param.bin", ".bin"))
    if fixed_bin is None:  # fix wrote its .bin next to its output: not reached in practice
        raise ParamSurgeryError(f"--kvcache: no weights next to {fixed}", file=args.param)
    shapes = getattr(args, "length_inputs", None)
    if not shapes:
        raise ParamSurgeryError(f"--kvcache: no input shapes with the length symbolic to "
                                f"prove the cache with (fix dynamized no static trace); run "
                                f"add-kvcache {fixed} --bin {fixed_bin} --verify --inputshape "
                                f"'BLOB=[T,...]' (or the decoder io flags)", file=args.param)
    spec = " ".join(f"{b}=[{','.join(str(d) for d in shape)}]" for b, shape in shapes.items())
    print(f"kvcache: add-kvcache {fixed} --bin {fixed_bin} --verify --inputshape {spec}")
    argv = ["add-kvcache", os.fspath(fixed), "--bin", os.fspath(fixed_bin), "--verify",
            "--inputshape", *spec.split()]
    parser = argparse.ArgumentParser(prog="paramsurgery")  # add-kvcache's own parser
    add_kvcache.register(parser.add_subparsers())
    kv_args = parser.parse_args(argv)
    return kv_args.run(kv_args)
