"""What a match returns: `Match` (captures, or the reason it failed) for a matcher that
returns, `NoMatch` for one that raises from deep inside a walk. Shared by the walks
(`patterns.match`), the pnnx readers and the analyses that follow a chain of layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paramsurgery.ir.layer import Layer


@dataclass
class Match:
    layer: Layer
    ok: bool
    reason: str = ""
    captures: dict[str, Any] = field(default_factory=dict)
    kind: str = ""  # a tag a caller may branch on (never the reason's text)

    def __bool__(self) -> bool:
        return self.ok

    def __getitem__(self, key: str) -> Any:
        return self.captures[key]


def matched(layer: Layer, **captures: Any) -> Match:
    return Match(layer, True, "", captures)


def fail(layer: Layer, reason: str, *, kind: str = "") -> Match:
    return Match(layer, False, reason, kind=kind)


class NoMatch(Exception):
    """A pattern does not match: the layer where it stopped (None: at a graph input or a
    blob nobody writes) and why, in words `--explain` prints as they are. `kind`: a tag a
    caller may branch on (never the reason's text)."""

    def __init__(self, layer: Layer | None, reason: str, *, kind: str = "") -> None:
        super().__init__(reason)
        self.layer = layer
        self.reason = reason
        self.kind = kind

    def __str__(self) -> str:
        return self.reason

    def format(self) -> str:
        """`line N: Type name: reason` (the reason alone when there is no layer)."""
        if self.layer is None:
            return self.reason
        where = f"line {self.layer.source_line}: " if self.layer.source_line else ""
        return f"{where}{self.layer.type} {self.layer.name}: {self.reason}"


class MatchStatus(Enum):
    """How far a match got: the pattern did not fit, it fitted but a check on it failed, or
    it was taken and the rewrite could not be done."""

    NO_MATCH = "no match"
    CHECK_FAILED = "check failed"
    REWRITE_FAILED = "rewrite failed"


@dataclass
class MatchFailure:
    """Why a candidate was not rewritten: its status, the reason in words, the layer where it
    stopped (`at`: a name, "" at a graph input) and how many pattern layers had matched."""

    status: MatchStatus
    reason: str
    at: str = ""
    matched: int = 0
    near: bool = False  # it stopped at a layer of the right type (its params differ)

    def format(self) -> str:
        where = f"{self.at}: " if self.at else ""
        return f"{where}{self.status.value} after {self.matched} layer(s): {self.reason}"


@dataclass
class Explain:
    """Keeps each rule's best near-miss (the failure that matched the most layers), so
    `--explain` can say why a rule never fired."""

    best: dict[str, MatchFailure] = field(default_factory=dict)

    def record(self, rule: str, failure: MatchFailure) -> None:
        old = self.best.get(rule)
        if old is None or failure.matched > old.matched:
            self.best[rule] = failure
