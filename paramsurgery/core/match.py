"""The one failure type of matching and rewriting: `MatchFailure` — raised from deep inside a
walk, returned by a matcher, recorded on a pass's result as a candidate left alone, and kept
by `Explain` as a rule's best near-miss. `Match` is what a matcher that returns gives back:
captures, or its `MatchFailure`. Shared by the walks (`patterns.match`), the rule engine
(`patterns.pattern`), the pnnx readers, the analyses that follow a chain of layers and every
pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paramsurgery.ir.layer import Layer


class MatchStatus(Enum):
    """How far a match got: the pattern did not fit, it fitted but a check on it failed, or
    it was taken and the rewrite could not be done."""

    NO_MATCH = "no match"
    CHECK_FAILED = "check failed"
    REWRITE_FAILED = "rewrite failed"


class MatchFailure(Exception):
    """Why a candidate was not matched or rewritten, in words `--explain` prints as they are.

    `at`: the layer where it stopped (a `Layer`, or its name when only the name is known;
    None: at a graph input or a blob nobody writes); kept as `layer` (its name, "" for none)
    and `stopped_at` (the `Layer`, when it was given). `status`: how far it got. `kind`: a tag a
    caller may branch on (never the reason's text). `line`: the layer's source line.
    `matched`: how many pattern layers had matched; `near`: it stopped at a layer of the right
    type (its params differ) — both rank near-misses."""

    def __init__(self, at: Layer | str | None, reason: str, *,
                 status: MatchStatus = MatchStatus.NO_MATCH, kind: str = "",
                 line: int | None = None, matched: int = 0, near: bool = False) -> None:
        super().__init__(reason)
        self.stopped_at: Layer | None = None if at is None or isinstance(at, str) else at
        self.layer = at if isinstance(at, str) else (at.name if at is not None else "")
        self.reason = reason
        self.status = status
        self.kind = kind
        self.line = line if line is not None or self.stopped_at is None else self.stopped_at.source_line
        self.matched = matched
        self.near = near

    @classmethod
    def declined(cls, reason: str, layer: Layer | None = None) -> MatchFailure:
        """A rule that knows the op but cannot handle this instance exactly: it matched, a
        check on it failed."""
        return cls(layer, reason, status=MatchStatus.CHECK_FAILED)

    def __str__(self) -> str:
        return self.reason

    def __repr__(self) -> str:
        return f"MatchFailure({self.layer!r}, {self.reason!r}, status={self.status.name})"

    def format(self) -> str:
        """`line N: Type name: reason` (`line N: name: reason` when only the name is known;
        the reason alone when there is no layer)."""
        where = f"line {self.line}: " if self.line else ""
        if self.stopped_at is not None:
            return f"{where}{self.stopped_at.type} {self.stopped_at.name}: {self.reason}"
        if self.layer:
            return f"{where}{self.layer}: {self.reason}"
        return self.reason

    def near_miss(self) -> str:
        """The rule engine's wording: where, how far it got, why."""
        where = f"{self.layer}: " if self.layer else ""
        return f"{where}{self.status.value} after {self.matched} layer(s): {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {"layer": self.layer, "reason": self.reason, "line": self.line}


@dataclass
class Match:
    layer: Layer
    ok: bool
    failure: MatchFailure | None = None
    captures: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.ok

    def __getitem__(self, key: str) -> Any:
        return self.captures[key]

    @property
    def reason(self) -> str:
        return self.failure.reason if self.failure is not None else ""

    @property
    def kind(self) -> str:
        return self.failure.kind if self.failure is not None else ""


def matched(layer: Layer, **captures: Any) -> Match:
    return Match(layer, True, None, captures)


def fail(layer: Layer, reason: str, *, kind: str = "") -> Match:
    return Match(layer, False, MatchFailure(layer, reason, kind=kind))


@dataclass
class Explain:
    """Keeps each rule's best near-miss (the failure that matched the most layers), so
    `--explain` can say why a rule never fired."""

    best: dict[str, MatchFailure] = field(default_factory=dict)

    def record(self, rule: str, failure: MatchFailure) -> None:
        old = self.best.get(rule)
        if old is None or failure.matched > old.matched:
            self.best[rule] = failure
