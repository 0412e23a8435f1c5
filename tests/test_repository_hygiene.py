"""Text files of the repository hold no merge-conflict markers.

A rebase once left `<<<<<<< HEAD ... >>>>>>> main` in README's pass table on main and no
test noticed: every tracked text file is checked here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARKER = re.compile(rb"^(<<<<<<< |=======$|>>>>>>> )", re.MULTILINE)
TEXT_SUFFIXES = {".py", ".md", ".toml", ".case", ".txt", ".json", ".cfg", ".sh", ".yml",
                 ".yaml", ".html", ".js", ".css"}


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    names = [n for n in out.stdout.decode().split("\0") if n]
    return [REPO / n for n in names if Path(n).suffix in TEXT_SUFFIXES]


def test_no_conflict_markers() -> None:
    files = _tracked_text_files()
    assert len(files) > 100  # the walk saw the repository, not an empty listing
    bad = []
    for path in files:
        if not path.is_file():
            continue
        data = path.read_bytes()
        for m in MARKER.finditer(data):
            line = data.count(b"\n", 0, m.start()) + 1
            bad.append(f"{path.relative_to(REPO)}:{line}: {m.group(0).decode().strip()}")
    assert not bad, "merge-conflict markers:\n" + "\n".join(bad)
