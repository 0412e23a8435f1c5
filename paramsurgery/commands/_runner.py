"""One runner for the commands that write graphs: load → pass → verify → write → report.

A command is a subclass of `GraphCommand` that overrides what differs (its pass, where it
writes, its check, its extra files and report lines; a command that is one pass and nothing
else is a `PassCommand`, run by `run_param_pass`); the base runs the rest the same way for
all:

- input: `args.param`, and `args.bin` when given: the weights are loaded and checked
  against the graph first (a mismatch names the layer);
- output: `-o` (a `.param` path, or a prefix for commands writing several files), the
  derived default `<input>.<tag>.param`, `--in-place`, or `-` (stdout); an output naming an
  input is refused;
- weights: rewritten next to the output when the pass changed a weighted layer, else a
  hard link (or copy) of the input `.bin`;
- verify: the candidate files are staged in a temporary directory and handed to the
  command's check before anything is written; a failed check prints the report and the
  check on stderr and exits 1 with nothing written;
- every output file is renamed into place together (`io.atomic_write_many`);
- report: text (stdout, or stderr when the graph goes to stdout) or `--format json`.

Errors are `ParamSurgeryError`s located at the input (exit 2); a refusal rolls back.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Callable, Protocol

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.commands._common import derived_output, link_or_copy, output_path, print_json

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph
    from paramsurgery.passes.base import PassResult


class PassLike(Protocol):
    """What a command runs: a graph in, a PassResult out (a `Pass`, or a pipeline)."""

    def __call__(self, g: "Graph") -> "PassResult": ...


class Check(Protocol):
    """What a verify callback returns."""

    @property
    def ok(self) -> bool: ...

    def format(self) -> str: ...


@dataclass
class Outputs:
    """Where a command writes: the `.param` (`-` = stdout), the `.bin` (None: no weights
    written) and extra files by role (a manifest, a start graph)."""

    param: str
    bin: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def all(self) -> list[str]:
        return [self.param] + ([self.bin] if self.bin else []) + list(self.extra.values())


Writer = Callable[[IO[Any]], Any]

# the one prefix of the line a run that modified the graph and proved nothing prints (its
# JSON field is `not_verified`)
NOT_VERIFIED = "not verified through ncnn"


@dataclass
class Run:
    """One run of a command, as the callbacks see it."""

    args: argparse.Namespace
    source: "Graph"  # the input as loaded
    result: "PassResult"
    out: Outputs
    weights_changed: bool = False
    check: Any = None  # the command's own check object (a `Check`), None when not run
    bin_note: str | None = None

    @property
    def graph(self) -> "Graph":
        return self.result.graph


class GraphCommand:
    """The base of a graph-writing command: a subclass sets its `tag` and `make_pass`, and
    overrides the few steps it needs; `__call__` runs them in the same order for all.

    Declared as class attributes: `tag` (the default output is `<input>.<tag>.param`);
    `prefix` (`-o` is a prefix: `PREFIX.param`, `PREFIX.bin`, and `PREFIX<suffix>` for each
    of `extra`, role → suffix; else a `.param` path, its `.bin` next to it); `bin_note` (say
    what happened to the weights); `bin_required`; `verify_needs_bin` (`--verify` runs the
    weights: refuse it without them); `refusal` (what a failed check means) and
    `raise_on_failed_check` (a failed check is a VerificationError, exit 2, not exit 1)."""

    tag: str = ""
    prefix: bool = False
    extra: dict[str, str] = {}
    bin_note: bool = False
    bin_required: bool = False
    verify_needs_bin: bool = True
    raise_on_failed_check: bool = False
    refusal: str = "the result is not proven equal to the input"

    # ------------------------------------------------------------ what a subclass declares
    def make_pass(self, args: argparse.Namespace) -> PassLike:
        """The pass to run."""
        raise NotImplementedError

    def prepare(self, args: argparse.Namespace, g: "Graph") -> None:
        """Check the inputs against the loaded graph (raise), before the pass runs."""

    def before_write(self, run: Run) -> None:
        """A last refusal (raise) or fix-up once the outputs are known."""

    def refuse(self, run: Run) -> tuple[int, str] | None:
        """Before verifying: (exit code, why) to write nothing and end with that code (the
        report is still printed), or None."""
        return None

    def checks(self, run: Run) -> bool:
        """Whether the candidate files are staged and handed to `verify`: `--verify` was
        given (a command that checks by default says so here)."""
        return bool(getattr(run.args, "verify", False))

    def verify(self, run: Run, staged: Outputs) -> Check | None:
        """Check the staged candidate files (None: nothing to check)."""
        return None

    def unproven(self, run: Run) -> str | None:
        """What this run did not prove (the report's `not verified through ncnn: ...` line
        and the JSON's `not_verified`), or None: the graph was unmodified or a check ran. A
        command that always proves its result, or says so its own way, returns None."""
        if not run.result.modified or run.check is not None:
            return None
        return ("the rewritten graph was not run through ncnn (the pass's own tests prove its "
                "rewrite, not this output); run with --verify")

    def extra_writers(self, run: Run) -> dict[str, Writer]:
        """Role → writer of the extra files."""
        return {}

    def summary(self, run: Run) -> list[str]:
        """The report's first lines (also printed, on stderr, before a failed check)."""
        return [run.result.format(getattr(run.args, "explain", False))]

    def text(self, run: Run) -> list[str]:
        """The report's command-specific lines, after the summary."""
        return []

    def json(self, run: Run) -> dict[str, Any]:
        """The report's command-specific JSON fields."""
        return {}

    def default_prefix(self, param: str) -> str:
        """Prefix commands: `-o`'s default."""
        return _stem(derived_output(param, self.tag))

    def __call__(self, args: argparse.Namespace) -> int:
        try:
            return self._run(args)
        except ParamSurgeryError as exc:
            if exc.file is None:
                exc.file = args.param
            raise

    def finish(self, p: argparse.ArgumentParser, explain: str | None = None) -> None:
        """The options every graph command ends with (`--explain`, `--format`, and
        `--report PAGE`, which `add_output_args` adds for single-file commands), and this
        runner as what the command runs."""
        from paramsurgery.commands._common import add_format_arg, add_report_arg

        if explain is not None:
            p.add_argument("--explain", action="store_true", help=explain)
        add_format_arg(p)
        if self.prefix:
            add_report_arg(p)
        p.set_defaults(run=self)

    # ------------------------------------------------------------------ steps
    def outputs(self, args: argparse.Namespace) -> Outputs:
        bin_in = getattr(args, "bin", None)
        if self.prefix:
            from paramsurgery.commands._common import is_stdin

            if args.output in (None, "-") and (is_stdin(args.param) or args.output == "-"):
                raise ParamSurgeryError("this command writes several files: give -o PREFIX",
                                        file=args.param)
            prefix = args.output or self.default_prefix(args.param)
            if prefix.endswith(".param"):
                prefix = prefix[: -len(".param")]
            out = Outputs(prefix + ".param", prefix + ".bin" if bin_in else None,
                          {role: prefix + suffix for role, suffix in self.extra.items()})
            for path in out.all():
                for src in (args.param, bin_in):
                    if src and os.path.exists(path) and os.path.samefile(path, src):
                        raise ParamSurgeryError(f"output {path} would overwrite the input",
                                                file=src)
            return out
        if args.output is None and not getattr(args, "in_place", False):
            args.output = derived_output(args.param, self.tag)
        param = output_path(args, args.param)
        assert param is not None
        if param == "-":
            return Outputs(param)
        if param == args.param:  # --in-place: the weights stay where they are
            return Outputs(param, bin_in)
        return Outputs(param, bin_path_for(param) if bin_in else None)

    def _run(self, args: argparse.Namespace) -> int:
        from paramsurgery.formats.io import load

        bin_in = getattr(args, "bin", None)
        if not bin_in and (self.bin_required or
                           (self.verify_needs_bin and getattr(args, "verify", False))):
            need = "--verify needs" if getattr(args, "verify", False) else "this command needs"
            raise ParamSurgeryError(f"{need} the weights (--bin model.bin)", file=args.param)
        out = self.outputs(args)
        from paramsurgery.core import progress

        if out.param == "-":  # stdout carries the graph: the report and progress go to stderr
            progress.redirect(sys.stderr)
        if getattr(args, "verify", False):
            progress.plan(f"{getattr(args, 'command', None) or self.tag}: {args.param} -> "
                          f"{out.param}: rewriting, then proving the result through ncnn "
                          f"before anything is written", aside=True)
        source = load(args.param, bin=bin_in) if bin_in else load(args.param)
        self.prepare(args, source)
        result = self.make_pass(args)(source)
        run = Run(args, source, result, out,
                  weights_changed=bool(bin_in) and weights_changed(source, result.graph))
        self.before_write(run)
        refusal = self.refuse(run)
        if refusal is not None:
            code, why = refusal
            self.report(run, written=False)
            print(f"{args.param}: refusing to write {out.param}: {why}", file=sys.stderr)
            return code
        writers = self._writers(run)
        if self.checks(run):
            with tempfile.TemporaryDirectory(prefix=f"paramsurgery-{self.tag}-") as tmp:
                staged = _staged(run, writers, tmp)
                run.check = self.verify(run, staged)
        if run.check is not None and not run.check.ok:
            for line in self.summary(run):
                print(line, file=sys.stderr)
            print(run.check.format(), file=sys.stderr)
            if self.raise_on_failed_check:
                from paramsurgery.core.errors import VerificationError

                raise VerificationError(self.refusal, file=args.param)
            print(f"{args.param}: refusing to write {out.param}: {self.refusal}",
                  file=sys.stderr)
            return 1
        skip = self.write(run, writers)
        return self.report(run, written=skip is None, note=skip)

    def _writers(self, run: Run) -> dict[str, Writer]:
        """Role → writer of every file this run may write (`param`, `bin`, extras)."""
        from paramsurgery.formats.io import names_file, param_bytes

        data = param_bytes(run.graph, run.out.param)  # a .param.bin output stays binary
        writers: dict[str, Writer] = {"param": lambda fh: fh.write(data)}
        names = names_file(run.graph, run.out.param)  # and keeps its names beside it
        if names is not None:
            writers["names"] = lambda fh: fh.write(names[1])
        if run.weights_changed:
            from paramsurgery.formats.weights import write_weights

            writers["bin"] = lambda fh: write_weights(run.graph, fh)
        writers.update(self.extra_writers(run))
        return writers

    def write(self, run: Run, writers: dict[str, Writer]) -> str | None:
        """Write every output (renamed into place together); or say why nothing needs
        writing (printed instead of "wrote")."""
        from paramsurgery.core.fs import atomic_write_many

        args, out = run.args, run.out
        if out.param == "-":
            writers["param"](sys.stdout.buffer)
            return None
        unchanged = not run.result.modified and out.param == args.param
        paths = {**out.extra, "param": out.param}
        if "names" in writers:
            from paramsurgery.formats.param_bin import id_h_path

            paths["names"] = id_h_path(out.param)
        if "bin" in writers and out.bin:
            paths["bin"] = out.bin
        todo: dict[str | os.PathLike, Callable[[IO[Any]], None]] = {
            paths[role]: w for role, w in writers.items()
            if role in paths and not (role == "param" and unchanged)}
        if todo:
            atomic_write_many(todo)
        if out.bin and "bin" not in writers and out.bin != args.bin:
            how = link_or_copy(args.bin, out.bin)
            run.bin_note = f"weights: unchanged; {out.bin} is a {how} of {args.bin}"
        elif "bin" in writers and out.bin:
            run.bin_note = f"weights: rewritten to {out.bin}"
        return None

    def report(self, run: Run, *, written: bool = True, note: str | None = None) -> int:
        """Print the report and return the exit code (0); `written`: the outputs were
        written (else `note`, when given, says why not, in place of the "wrote" line)."""
        args, result, out = run.args, run.result, run.out
        unproven = self.unproven(run) if written else None
        if args.format == "json":
            data: dict[str, Any] = {"pass": result.pass_name,
                                    "output": out.param,
                                    "written": written, "modified": result.modified,
                                    "changes": [c.__dict__ for c in result.changes],
                                    "skipped": [s.to_json() for s in result.skipped],
                                    "notes": result.notes,
                                    "contract_changes": result.contract_changes}
            if run.check is not None and hasattr(run.check, "to_json"):
                data["verify"] = run.check.to_json()
            data.update(self.json(run))
            if unproven is not None:
                data["not_verified"] = unproven
            data["files"] = self._files(run, written)
            print_json(data, stream=sys.stderr if out.param == "-" else None)
            return 0
        stream = sys.stderr if out.param == "-" else sys.stdout
        for line in self.summary(run) + self.text(run):
            print(line, file=stream)
        if run.check is not None:
            from paramsurgery.core import progress

            rest = progress.unshown(run.check.format())  # lines shown as they came: not again
            if rest:
                print(rest, file=stream)
        if unproven is not None:
            print(f"{NOT_VERIFIED}: {unproven}", file=stream)
        if self.bin_note and run.bin_note:
            print(run.bin_note, file=stream)
        if note is not None:
            print(note, file=stream)
        elif out.param != "-" and written:
            changed = result.modified or out.param != args.param
            files = [p for p in out.all() if changed or p != out.param]
            print("wrote " + ", ".join(files) if changed else f"{out.param} unchanged",
                  file=stream)
        return 0

    def _files(self, run: Run, written: bool = True) -> list[dict[str, Any]]:
        """Every file read or written, with its role (the JSON `files` list); outputs that
        were not written (`written`) are left out."""
        args, out = run.args, run.out
        files: list[dict[str, Any]] = [{"file": args.param, "role": "input"}]
        if getattr(args, "bin", None):
            files.append({"file": args.bin, "role": "weights"})
        if not written:
            return files
        files.append({"file": out.param, "role": "output"})
        if out.bin:
            files.append({"file": out.bin, "role": "output weights"})
        files += [{"file": path, "role": role} for role, path in out.extra.items()]
        return files


def weights_changed(before: "Graph", after: "Graph") -> bool:
    """Whether `after`'s weighted layers differ from `before`'s (a pass replaced, added or
    removed one): then the output needs its own `.bin`."""
    def weighted(g: "Graph") -> list[int]:
        return [id(layer.weights) for layer in g if layer.weights]

    return weighted(before) != weighted(after)


def bin_path_for(param_path: str) -> str:
    """`out.param` → `out.bin` (ncnn's pairing)."""
    stem = param_path[: -len(".param")] if param_path.endswith(".param") else param_path
    return stem + ".bin"


def _stem(param_path: str) -> str:
    return param_path[: -len(".param")] if param_path.endswith(".param") else param_path


def _staged(run: Run, writers: dict[str, Writer], tmp: str) -> Outputs:
    """The candidate files in `tmp` (the input `.bin` itself when the weights are kept)."""
    staged = Outputs(os.path.join(tmp, "candidate.param"),
                     getattr(run.args, "bin", None),
                     {role: os.path.join(tmp, os.path.basename(p))
                      for role, p in run.out.extra.items()})
    if "bin" in writers:
        staged.bin = os.path.join(tmp, "candidate.bin")
    paths = {**staged.extra, "param": staged.param}
    if staged.bin is not None:
        paths["bin"] = staged.bin
    for role, write in writers.items():
        if role in paths:
            with open(paths[role], "wb") as fh:
                write(fh)
    return staged


# --------------------------------------------------------------------------- shared options

def add_bin_arg(p: argparse.ArgumentParser, *, positional: bool = False,
                required: bool = False, what: str | None = None) -> None:
    """The weights: `--bin B` on every command; `positional` also keeps the positional
    `.bin` after the model as an alias (the commands that had one); `required`: one of the
    two must be given (`_common.resolve_bin` joins them into `args.bin`)."""
    what = what or ("its weights (.bin): checked against the graph, then rewritten next to "
                    "the output when the pass changes a weighted layer, else linked (or "
                    "copied)")
    from paramsurgery.commands._common import add_weights_arg

    add_weights_arg(p, what, positional=positional, required=required)


def add_pnnx_arg(p: argparse.ArgumentParser, what: str = "traced shapes") -> None:
    p.add_argument("--pnnx", metavar="PNNX_PARAM",
                   help=f"pnnx's own IR ({what}); default: X.pnnx.param next to "
                        f"X.ncnn.param, if present")


def traced_path(args: argparse.Namespace) -> str | None:
    """`--pnnx`, else pnnx's IR next to the input."""
    from paramsurgery.formats.pnnx_traced import companion_pnnx

    found = args.pnnx or companion_pnnx(args.param)
    return os.fspath(found) if found is not None else None


def add_partial_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--partial", action="store_true",
                   help="rewrite what can be proven and keep (and list) the rest, instead of "
                        "refusing")


def add_verify_args(p: argparse.ArgumentParser, what: str, *, tol: float) -> None:
    """`--verify` (what it compares; checked before anything is written) and `--tol`."""
    p.add_argument("--verify", action="store_true",
                   help=f"{what} before writing; refuse (exit 1, nothing written) on a mismatch")
    p.add_argument("--tol", type=float, default=tol,
                   help=f"--verify: relative tolerance (default {tol:g})")


def prove_equivalent(args: argparse.Namespace, staged: Outputs, reference: str,
                     reference_bin: str | None) -> Any:
    """The staged candidate against `reference` through ncnn, on inputs from `--inputshape`
    (each symbol at every `--lengths` value) or `--inputs` (`verify.equivalence`)."""
    from paramsurgery.commands._common import inputshape_of
    from paramsurgery.verify.equivalence import verify_equivalent

    shapes = inputshape_of(args)
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    syms = {sym for s in shapes.values() for d in s for sym in getattr(d, "symbols", ())}
    return verify_equivalent(staged.param, reference, bin=staged.bin, reference_bin=reference_bin,
                             inputshape=shapes, values={sym: lengths for sym in syms},
                             inputs=args.inputs, tol=args.tol, seed=args.seed)


class PassCommand(GraphCommand):
    """A command that is one pass and nothing else (the passes' own commands, the hand
    patches, the single repairs): `make()` builds the pass, inside the runner, so a
    refusal while building it is located at the input. `prove(result)`, when given and
    the pass changed something, returns a report with `.ok`, `.format()` and
    `.to_json()`; a failed proof writes nothing (VerificationError)."""

    refusal = "the rewrite could not be proven; nothing written"
    raise_on_failed_check = True
    verify_needs_bin = False

    def __init__(self, tag: str, make: Callable[[], PassLike],
                 prove: Callable[["PassResult"], Check] | None = None) -> None:
        self.tag, self._make, self._prove = tag, make, prove
        # a failed proof of the pass's own is a VerificationError (exit 2); a failed --verify
        # is a mismatch like every command's (exit 1, nothing written)
        self.raise_on_failed_check = prove is not None

    def make_pass(self, args: argparse.Namespace) -> PassLike:
        return self._make()

    def verify(self, run: Run, staged: Outputs) -> Check | None:
        if not run.result.modified:
            return None
        if self._prove is not None:
            return self._prove(run.result)
        if not getattr(run.args, "verify", False):
            return None
        before, after = run.source, run.graph
        for what, old, new in (("inputs", before.inputs, after.inputs),
                               ("outputs", before.outputs, after.outputs)):
            if sorted(old) != sorted(new):
                gone = ", ".join(sorted(set(old) - set(new))) or "none"
                added = ", ".join(sorted(set(new) - set(old))) or "none"
                raise ParamSurgeryError(
                    f"--verify: the pass changed the graph's {what} (gone: {gone}; new: "
                    f"{added}), so the result cannot be run against the input on the same "
                    f"feeds; run without --verify (the report says it is not verified), or "
                    f"compare it yourself with a reference of the new {what}",
                    file=run.args.param)
        return prove_equivalent(run.args, staged, run.args.param, getattr(run.args, "bin", None))


def run_param_pass(args: argparse.Namespace, tag: str, make: Callable[[], PassLike],
                   prove: Callable[["PassResult"], Check] | None = None) -> int:
    """Load, run the pass `make()` builds (on a copy), write the result atomically, print
    the report (`PassCommand`). Exit 0 when the pass ran (changed or not); a refusal raises
    PassRefused (exit 2)."""
    return PassCommand(tag, make, prove)(args)
