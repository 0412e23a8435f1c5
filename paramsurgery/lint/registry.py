"""The rule registry: rules are data.

A rule is a code (`PS001`), a slug, a default severity, a one-line summary, the command
that repairs what it finds (`fix`, and `fix_pass`, the pass name `paramsurgery fix` runs),
what it needs besides the `.param` (`bin`, `pnnx`, `run`) and one small check function whose
doc string is what `paramsurgery lint --explain CODE` prints.

A check takes the `LintContext` and yields `Hit`s (a layer and a message; the runner makes
them `Finding`s with the rule's code, severity and fix) or ready `Finding`s.

Code ranges: PS0xx converter / layer problems, PS1xx graph structure (shared with
`validate(g)`), PS2xx weights (`--bin`), PS3xx scale hazards, PS4xx traced-shape
conformance (pnnx's `.pnnx.param`, a reference run).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Sequence, Union

from paramsurgery.core.findings import ERROR, INFO, SEVERITIES, WARNING, Finding

if TYPE_CHECKING:
    from paramsurgery.ir.layer import Layer
    from paramsurgery.lint.context import LintContext

__all__ = ["Rule", "Hit", "RULES", "rule", "CATEGORIES",
           "ERROR", "WARNING", "INFO"]

CATEGORIES = {
    "PS0": "converter and layer problems",
    "PS1": "graph structure",
    "PS2": "weights (--bin)",
    "PS3": "scale hazards",
    "PS4": "traced-shape conformance (.pnnx.param, reference runs)",
}

NEEDS = ("bin", "pnnx", "run")


@dataclass
class Hit:
    """What a check found. `severity`/`fix`/`fix_pass` override the rule's defaults."""

    layer: "Layer | None"
    message: str
    severity: str | None = None
    fix: str | None = None
    fix_pass: str | None = None
    line: int | None = None  # when there is no layer (header, file-level)


CheckFn = Callable[["LintContext"], Iterable[Union[Hit, Finding]]]


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: str
    summary: str
    check: CheckFn = field(repr=False, compare=False)
    fix: str | None = None  # what to run, for people ("paramsurgery fix-slice")
    fix_pass: str | None = None  # the pass name, for `paramsurgery fix` ("fix-slice")
    needs: frozenset[str] = frozenset()
    doc: str = ""
    default: bool = True  # False: runs only when selected (--select PS009, PS0, ALL)
    also: tuple[str, ...] = ()  # other severities its findings carry (a hit's own severity)

    @property
    def severities(self) -> tuple[str, ...]:
        """Every severity its findings carry, the default first (`warning/info`)."""
        return (self.severity,) + tuple(s for s in self.also if s != self.severity)

    @property
    def category(self) -> str:
        return CATEGORIES.get(self.code[:3], "")

    def explain(self) -> str:
        """What `paramsurgery lint --explain CODE` prints."""
        head = f"{self.code} ({self.name}) [{'/'.join(self.severities)}]: {self.summary}"
        lines = [head, ""]
        if self.doc:
            lines.append(self.doc)
            lines.append("")
        lines.append(f"Fix: {self.fix}" if self.fix else "Fix: no automatic repair; see above.")
        if not self.default:
            lines.append(f"Off by default: runs only when selected (--select {self.code}).")
        if self.needs:
            lines.append("Needs: " + ", ".join(_NEEDS_TEXT[n] for n in sorted(self.needs)))
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"code": self.code, "name": self.name, "severity": self.severity,
                "severities": list(self.severities),
                "summary": self.summary, "fix": self.fix, "fix_pass": self.fix_pass,
                "needs": sorted(self.needs), "category": self.category,
                "default": self.default}


_NEEDS_TEXT = {
    "bin": "the weights (--bin)",
    "pnnx": "pnnx's .pnnx.param (--pnnx-param, or found next to the file)",
    "run": "running the graph through ncnn in a child process (real or synth-bin weights)",
}

RULES: dict[str, Rule] = {}

_CODE_RE = re.compile(r"PS[0-9]{3}$")


def rule(code: str, name: str, severity: str, summary: str, *, fix: str | None = None,
         fix_pass: str | None = None, needs: Sequence[str] = (),
         default: bool = True, also: Sequence[str] = ()) -> Callable[[CheckFn], CheckFn]:
    """Register a check function as a rule. `fix_pass` without `fix` means the command
    `paramsurgery <fix_pass>`. `default=False`: the rule runs only when selected. `also`:
    the other severities its hits may carry (what `--explain` and `--list` show)."""
    if not _CODE_RE.match(code):
        raise ValueError(f"bad rule code {code!r}")
    if severity not in SEVERITIES or any(a not in SEVERITIES for a in also):
        raise ValueError(f"bad severity {severity!r} / {tuple(also)!r}")
    bad = set(needs) - set(NEEDS)
    if bad:
        raise ValueError(f"unknown needs {bad}")

    def deco(fn: CheckFn) -> CheckFn:
        if code in RULES:
            raise ValueError(f"two rules have the code {code}")
        RULES[code] = Rule(code, name, severity, summary, fn,
                           fix or (f"paramsurgery {fix_pass}" if fix_pass else None), fix_pass,
                           frozenset(needs), inspect.cleandoc(fn.__doc__ or ""), default,
                           tuple(also))
        return fn

    return deco


def parse_codes(values: Iterable[str] | str | None) -> list[str] | None:
    """`["PS0,PS101", "PS4"]` → `["PS0", "PS101", "PS4"]` (upper-cased prefixes)."""
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    out: list[str] = []
    for v in values:
        for part in str(v).split(","):
            part = part.strip().upper()
            if part:
                out.append(part)
    return out
