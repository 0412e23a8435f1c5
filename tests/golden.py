"""Golden-file helper: compare text with tests/golden/<name>; PARAMSURGERY_UPDATE_GOLDEN=1
rewrites the file instead (then review the diff)."""

import os
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("PARAMSURGERY_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path} (set PARAMSURGERY_UPDATE_GOLDEN=1)"
    assert text == path.read_text(), f"output differs from {path}"
