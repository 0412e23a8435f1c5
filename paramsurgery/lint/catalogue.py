"""Every lint rule: the rule modules registered into `registry.RULES`, loaded on first use,
and selecting among them by code prefix (`--select` / `--ignore`)."""

from __future__ import annotations

from typing import Iterable, Sequence

from paramsurgery.lint.registry import RULES, Rule, parse_codes


def _load_rules() -> None:
    from paramsurgery.lint import (
        rules_layers,  # noqa: F401
        rules_loader,  # noqa: F401
        rules_scale,  # noqa: F401
        rules_shapes,  # noqa: F401
        rules_structure,  # noqa: F401
        rules_transformers,  # noqa: F401
        rules_weights,  # noqa: F401
    )


def all_rules() -> dict[str, Rule]:
    _load_rules()
    return dict(sorted(RULES.items()))


def get_rule(code: str) -> Rule | None:
    _load_rules()
    return RULES.get(code.upper().strip())


def _matches(code: str, prefixes: Sequence[str]) -> bool:
    return any(p == "ALL" or code.startswith(p) for p in prefixes)


def select_rules(select: Iterable[str] | str | None = None,
                 ignore: Iterable[str] | str | None = None) -> list[Rule]:
    """Rules whose code starts with one of `select` (default: every rule that is on by
    default) and none of `ignore` (ruff-style prefixes: `PS0`, `PS10`, `PS106`; `ALL`). An
    unknown code raises ValueError."""
    rules = all_rules()
    sel = parse_codes(select)
    ign = parse_codes(ignore) or []
    for p in (sel or []) + ign:
        if p != "ALL" and not any(c.startswith(p) for c in rules):
            raise ValueError(f"no lint rule matches {p!r} (codes are PS001 … PS4xx; see "
                             f"paramsurgery lint --list)")
    return [r for c, r in rules.items()
            if (r.default if sel is None else _matches(c, sel)) and not _matches(c, ign)]
