"""A finding: something a check noticed about a graph, with enough context to act on it.
Shared by `validate(g)`, the lint rules and the pass reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

ERROR = "error"
WARNING = "warning"
INFO = "info"
SEVERITIES = (ERROR, WARNING, INFO)


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    message: str
    layer: str | None = None  # layer name
    line: int | None = None  # 1-based line in the source file
    file: str | None = None
    fix: str | None = None  # the command that repairs it, for people
    fix_pass: str | None = None  # the registered pass that repairs it (what `fix` runs)

    def format(self, default_file: str | None = None) -> str:
        where = self.file or default_file or "<graph>"
        if self.line is not None:
            where += f":{self.line}"
        text = f"{where}: {self.code} {self.severity} {self.message}"
        if self.fix:
            text += f" (fix: {self.fix})"
        return text

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}
