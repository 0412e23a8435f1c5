"""Paths of the fixtures shipped with the package (package `paramsurgery.fixtures`, which is
the repository's `fixtures/` directory)."""

from __future__ import annotations

from pathlib import Path


def fixtures_dir() -> Path:
    try:
        from importlib.resources import files

        root = Path(str(files("paramsurgery.fixtures")))
        if root.is_dir():
            return root
    except (ModuleNotFoundError, TypeError):
        pass
    repo = Path(__file__).resolve().parent.parent / "fixtures"
    if repo.is_dir():
        return repo
    raise FileNotFoundError("paramsurgery's bundled fixtures are not installed")


def fixture(relpath: str) -> Path:
    path = fixtures_dir() / relpath
    if not path.exists():
        raise FileNotFoundError(f"bundled fixture {relpath!r} not found in {fixtures_dir()}")
    return path
