"""Pass infrastructure: `requires` → `run` → `ensures`, results that say what changed, and a
manager that rolls a failed pass back.

A pass never hands back a half-rewritten graph: `Pass.__call__` works on a copy unless told
otherwise, and the manager keeps the last good graph when a pass refuses or its
postcondition fails. Passes register themselves by name so `paramsurgery passes` can list
them.

A pass is declared in one place, its class statement: `class FixPow(Pass, name="fix-pow",
summary="...", tag="pow", repair_order=48)` registers it and makes it a frozen dataclass whose
fields are its options (`passes/options.py`).

A pass that repairs what lint finds declares it here, in its own class: `repair_order` (set:
`paramsurgery fix` may run it, in this order), `claims(layer)` (the converter leftovers it
rewrites; `patterns/claims.py` holds the same as data for lint's PS004, which names it as the
fix), `fix_inputs` (the extra inputs it can use,
which `fix` exposes as flags) and `for_fix(ctx, asked)` (the instance `fix` runs). `fix`
builds its plan from these and the findings' `fix_pass`: adding a repair is one file.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import (TYPE_CHECKING, AbstractSet, Any, Callable, ClassVar, Iterable, Sequence,
                    dataclass_transform)

from paramsurgery.core.match import MatchFailure
from paramsurgery.core.changes import Change
from paramsurgery.core.errors import PassRefused
from paramsurgery.core.findings import ERROR, Finding
from paramsurgery.ir.graph import Graph
from paramsurgery.analysis.validate import validate
from paramsurgery.passes.options import internal, option

if TYPE_CHECKING:

    from paramsurgery.ir.layer import Layer
    from paramsurgery.formats.pnnx_param import PnnxGraph
    from paramsurgery.formats.pnnx_traced import PnnxOp

PASSES: dict[str, type["Pass"]] = {}


def register(cls: type["Pass"]) -> type["Pass"]:
    """Class decorator: make a pass known to `paramsurgery passes` (its command, unless it
    says otherwise, is `paramsurgery <name>`)."""
    if cls.name in PASSES and PASSES[cls.name] is not cls:
        raise ValueError(f"two passes are named {cls.name!r}")
    if "command" not in cls.__dict__:
        cls.command = f"paramsurgery {cls.name}"
    PASSES[cls.name] = cls
    return cls


def all_passes() -> dict[str, type["Pass"]]:
    """Every registered pass (importing the modules of paramsurgery.passes registers them)."""
    import importlib
    import pkgutil

    from paramsurgery import passes

    for info in pkgutil.iter_modules(passes.__path__):
        if info.name not in ("base", "match") and not info.name.startswith("_"):
            importlib.import_module(f"{passes.__name__}.{info.name}")
    return dict(sorted(PASSES.items()))


def repairs() -> list[type["Pass"]]:
    """The passes `paramsurgery fix` may run, in their `repair_order` (the package is
    scanned once per process)."""
    return list(_repairs())


@functools.lru_cache(maxsize=None)
def _repairs() -> tuple[type["Pass"], ...]:
    found = [p for p in all_passes().values() if p.repair_order is not None]
    return tuple(sorted(found, key=lambda p: (p.repair_order or 0, p.name)))


def repair_for(layer: "Layer") -> str | None:
    """The repair pass that claims a converter leftover, or None."""
    for p in repairs():
        if p.claims(layer):
            return p.name
    return None


@dataclass
class PassResult:
    graph: Graph
    modified: bool
    changes: list[Change] = field(default_factory=list)
    skipped: list[MatchFailure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pass_name: str = ""
    data: dict = field(default_factory=dict)  # pass-specific facts (e.g. cache blob names)
    # what a caller must now do differently: an input or output whose meaning changed
    # although its name did not (e.g. a past input that now wants ncnn's opaque cache)
    contract_changes: list[str] = field(default_factory=list)

    def format(self, explain: bool = False) -> str:
        lines = []
        head = f"{self.pass_name}: " if self.pass_name else ""
        if self.modified:
            lines.append(f"{head}{len(self.changes)} change(s)")
            lines.extend("  " + c.format() for c in self.changes)
        else:
            lines.append(f"{head}nothing to change")
        lines.extend("  note: " + n for n in self.notes)
        lines.extend("  contract change: " + c for c in self.contract_changes)
        if explain and self.skipped:
            lines.append(f"  left alone ({len(self.skipped)}):")
            lines.extend("    " + s.format() for s in self.skipped)
        elif self.skipped:
            lines.append(f"  {len(self.skipped)} candidate(s) left alone (--explain says why)")
        return "\n".join(lines)


@dataclass(frozen=True)
class FixInput:
    """An extra input a repair can use, declared by the pass (`Pass.fix_inputs`) and exposed
    by `paramsurgery fix` as `flag` (argparse `dest` = `name`); `for_fix` reads it with
    `ctx.option(name)`. `path`: a file (its existence is checked like the input's)."""

    flag: str
    help: str
    metavar: str = "PATH"
    type: Callable[[str], Any] = str
    path: bool = True

    @property
    def name(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


# the length a static export was traced at: read by more than one repair (one flag in fix)
TRACED_LEN = FixInput("--traced-len", "the length a static export was traced at (every "
                      "value equal to it may be length-derived)", metavar="T", type=int,
                      path=False)


@dataclass
class RepairContext:
    """What `paramsurgery fix` knows besides the graph, for `Pass.for_fix`."""

    traced: str | None = None  # pnnx's X.pnnx.param (traced shapes, constants)
    weights: bool = False  # the graph carries the weights of its .bin
    param: str | None = None  # the input file
    bin: str | None = None  # its weights (`--bin`)
    reference: str | None = None  # a torch reference (`--reference`, or X.ref.npz next to it)
    options: dict[str, Any] = field(default_factory=dict)  # the passes' `fix_inputs` values
    # another export of the same model (param, bin, pnnx IR) → its graph after the repairs
    # `fix` has applied to this one so far (so a pass can compare the two like for like)
    repaired_like: "Callable[[str, str | None, str | None], Graph] | None" = None
    # the graph is another export repaired only to be compared with the input (a `--pair`),
    # never written: a repair that needs weights only to write them may rewrite its
    # structure without them (pnnx writes the same params at either length)
    compare_only: bool = False

    def option(self, name: str) -> Any:
        """The value of a pass's declared input (`FixInput.name`), None when not given."""
        return self.options.get(name)

    @cached_property
    def pnnx(self) -> "PnnxGraph | None":
        """pnnx's IR (`traced`), parsed once per `fix` run: every pass and lint round that
        reads it receives this one graph (none of them edits it)."""
        from paramsurgery.formats.pnnx_param import read_pnnx_param

        return read_pnnx_param(self.traced) if self.traced is not None else None

    @property
    def traced_ops(self) -> "list[PnnxOp] | None":
        """pnnx's ops, of the one parsed graph (`pnnx`)."""
        return self.pnnx.ops if self.pnnx is not None else None

    def ops_at(self, path: "str | os.PathLike | None") -> "list[PnnxOp] | None":
        """pnnx's ops of another file (e.g. a `--pair`'s IR): read here, for the pass."""
        from paramsurgery.formats.pnnx_traced import load_traced

        return load_traced(path)

    def load_other(self, param: str, bin: str | None, pnnx: str | None) -> Graph:
        """Another export of the same model, as the input is by now (`repaired_like`), or
        as it is on disk when `fix` gave no such loader: the pass receives the graph."""
        if self.repaired_like is not None:
            return self.repaired_like(param, bin, pnnx)
        from paramsurgery.formats.io import load

        return load(param, bin=bin)


@dataclass(frozen=True)
class Deferred:
    """A pass input `fix` supplies when the pass runs rather than when it is planned (e.g.
    dynamize's pair, repaired like the input by the passes that run before it). The pass
    manager resolves it (`resolved`); the pass itself only ever receives the value."""

    get: "Callable[[], Any]"


def resolved(p: "Pass") -> "Pass":
    """`p` with each `Deferred` field replaced by its value (`p` itself when it has none)."""
    if not dataclasses.is_dataclass(p):
        return p
    late: dict[str, Any] = {f.name: value.get() for f in dataclasses.fields(p)
                            if isinstance(value := getattr(p, f.name), Deferred)}
    return dataclasses.replace(p, **late) if late else p  # type: ignore[type-var]


_UNSET: Any = object()  # a class keyword not given (None is a value: `tag=None`)


# a declared pass is a frozen dataclass (made in `__init_subclass__`): type checkers are told so
@dataclass_transform(frozen_default=True, field_specifiers=(option, internal, field))
class Pass:
    """Base class. A pass is declared by its class statement's keywords (`name`, `summary`,
    and any of `tag`, `repair_order`, `needs_weights`, `command`, `fix_inputs`): the class
    is registered and made a frozen dataclass (its fields are its options). It implements
    `run`; overrides `requires` to refuse up front and `ensures` to add postconditions."""

    def __init_subclass__(cls, *, name: str = _UNSET, summary: str = _UNSET,
                          tag: str | None = _UNSET, repair_order: int | None = _UNSET,
                          needs_weights: bool = _UNSET, command: str | None = _UNSET,
                          fix_inputs: "tuple[FixInput, ...]" = _UNSET, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        given = {"name": name, "summary": summary, "tag": tag, "repair_order": repair_order,
                 "needs_weights": needs_weights, "command": command, "fix_inputs": fix_inputs}
        for key, value in given.items():
            if value is not _UNSET:
                setattr(cls, key, value)
        if name is _UNSET:
            return  # an abstract base, or a pass declared the long way (`@register`)
        # a pass that still builds itself in its own __init__ is not a dataclass yet
        if "__init__" not in cls.__dict__:
            dataclasses.dataclass(frozen=True)(cls)
        register(cls)

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    command: ClassVar[str | None] = None  # the CLI command that runs it (set by `register`)
    repair_order: ClassVar[int | None] = None  # set: `paramsurgery fix` runs it, in this order
    fix_inputs: ClassVar[tuple[FixInput, ...]] = ()  # extra inputs `fix` exposes for it
    # set: the pass declares its own command `paramsurgery <name>` (writes <input>.<tag>.param;
    # its flags are its option fields, `passes/options.py`): no module in commands/ needed
    tag: ClassVar[str | None] = None
    needs_weights: ClassVar[bool] = False  # its command refuses without --bin

    @classmethod
    def claims(cls, layer: "Layer") -> bool:
        """A converter leftover this repair rewrites (lint's PS004 names it as the fix)."""
        return False

    @classmethod
    def for_fix(cls, ctx: RepairContext, asked: bool) -> "Pass | None":
        """The instance `paramsurgery fix` runs; `asked`: a finding calls for this pass.
        None: nothing to do. Raises PassRefused when asked but an input is missing (the
        message names the flag that supplies it)."""
        return cls() if asked else None

    def requires(self, g: Graph) -> None:
        """Raise PassRefused(reason) when the pass cannot apply to `g` at all."""

    def run(self, g: Graph) -> PassResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def ensures(self, g: Graph, before: list[Finding]) -> None:
        """Postcondition: the pass introduced no structural error (validate())."""
        new = new_errors(before, validate(g))
        if new:
            detail = "; ".join(f.format() for f in new[:5])
            # located on the first finding's line (of the input file) so the refusal reads
            # `file:line: ...` like every exit-2 message
            raise PassRefused(f"{self.name} would leave the graph invalid: {detail}",
                              line=next((f.line for f in new if f.line), None))

    def __call__(self, g: Graph, *, in_place: bool = False) -> PassResult:
        from paramsurgery.core.collector import paused_gc
        from paramsurgery.analysis.shapes.static import refresh_after
        from paramsurgery.analysis.shapes.hints import snapshot

        # a pass allocates per site while the whole graph is live: with the collector on,
        # its full collections rescan the graph again and again (superlinear in the sites)
        with paused_gc():
            work = g if in_place else g.copy()
            before = validate(work)
            self.requires(work)
            lines = snapshot(work)
            result = self.run(work)
            result.graph = work
            result.pass_name = result.pass_name or self.name
            if result.modified:
                if lines is not None:
                    refreshed = refresh_after(work, lines)
                    if refreshed:
                        result.notes.append(f"-23330 shape hints refreshed on {len(refreshed)} "
                                            f"layer(s) downstream of the change")
                self.ensures(work, before)
            return result


def check_selection(layers: Sequence["Layer"], named: AbstractSet[str], kind: str, *,
                    types: str | None = None) -> None:
    """A pass over layers of a kind (`--only`/`--skip` naming some of them): refuse when the
    graph has none (`types`: how to name them, default `kind`) or a name is not one."""
    if not layers:
        raise PassRefused(f"the graph has no {types or kind} layer")
    unknown = named - {layer.name for layer in layers}
    if unknown:
        raise PassRefused(f"--only/--skip name(s) that are not {kind} layers: "
                          f"{', '.join(sorted(unknown))}")


def keep_or_refuse(pass_name: str, result: PassResult, refused: list[MatchFailure], *, partial: bool,
                   what: str) -> None:
    """The candidates a pass could not prove: listed as skipped with `partial`, else one
    PassRefused naming each (`<pass> cannot prove the rewrite of N <what>: layer (line L):
    reason; ...`)."""
    if not refused:
        return
    result.skipped.extend(refused)
    if partial:
        return
    detail = "; ".join(f"{s.layer}" + (f" (line {s.line})" if s.line else "") +
                       f": {s.reason}" for s in refused)
    raise PassRefused(f"{pass_name} cannot prove the rewrite of {len(refused)} "
                      f"{what}: {detail}", line=next((s.line for s in refused if s.line), None))


def new_errors(before: Iterable[Finding], after: Iterable[Finding]) -> list[Finding]:
    """Error findings in `after` that `before` did not have (compared by code and layer)."""
    seen = {(f.code, f.layer, f.message) for f in before if f.severity == ERROR}
    seen_loose = {(f.code, f.layer) for f in before if f.severity == ERROR}
    return [f for f in after if f.severity == ERROR and (f.code, f.layer, f.message) not in seen
            and (f.code, f.layer) not in seen_loose]
