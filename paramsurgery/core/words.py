"""Counts in messages: "1 layer", "2 layers" (one spelling for every report)."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n noun`, with the noun in the plural unless n is 1."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
