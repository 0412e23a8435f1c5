"""Small text helpers shared by every report."""

from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """`1 layer`, `2 layers`, `0 blobs` (`plural` when adding an s is wrong)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
