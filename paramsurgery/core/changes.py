"""One edit a pass made, as its report shows it: plain data, so analyses that plan an edit
(a thaw, a lowering) can describe it before a pass applies it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Change:
    """One edit a pass made, for its report: `layer: what: before -> after`."""

    layer: str
    what: str
    before: Any = None
    after: Any = None
    line: int | None = None

    def format(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        if self.before is None and self.after is None:
            return f"{where}{self.layer}: {self.what}"
        return f"{where}{self.layer}: {self.what}: {_short(self.before)} -> {_short(self.after)}"


def _short(v: Any) -> str:
    s = repr(v) if not isinstance(v, str) else v
    return s if len(s) <= 80 else s[:77] + "..."
