"""A pass that sets `tag` declares its own command: no module in commands/, no shared file."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from paramsurgery.cli import build_parser, main
from paramsurgery.passes import base
from paramsurgery.core.changes import Change
from paramsurgery.passes.base import Pass, PassResult
from paramsurgery.passes.options import option

TEXT = "7767517\n3 3\nInput in0 0 1 in0\nReLU relu 1 1 in0 a\nSigmoid sig 1 1 a out0\n"


@dataclass(frozen=True)
class _RenameReLUs(Pass):
    """A pass declared in this file only: renames every ReLU (with --prefix, its one option
    field: the flag is built from it)."""

    name = "rename-relus-test"
    summary = "rename every ReLU (test pass)"
    tag = "renamed"

    prefix: str = option(default="r_", help="the new names' prefix")

    def run(self, g):  # noqa: ANN001, ANN201 - the Pass interface
        result = PassResult(g, False)
        for layer in g.by_type("ReLU"):
            old = layer.name
            layer.name = self.prefix + old
            result.changes.append(Change(layer.name, "name", old, layer.name))
            result.modified = True
        return result


@pytest.fixture
def declared_pass():
    base.register(_RenameReLUs)
    yield _RenameReLUs
    base.PASSES.pop(_RenameReLUs.name, None)


def test_a_pass_with_a_tag_is_a_command(declared_pass, tmp_path, capsys):
    src = tmp_path / "m.param"
    src.write_text(TEXT)
    # only the passes load for a command a pass declares, and it is listed with the others
    parser = build_parser([declared_pass.name, str(src)])
    assert declared_pass.name in parser._subparsers._group_actions[0].choices
    assert main([declared_pass.name, str(src), "--prefix", "x_"]) == 0
    out = (tmp_path / "m.renamed.param").read_text()
    assert out.splitlines()[3].split() == ["ReLU", "x_relu", "1", "1", "in0", "a"]
    assert out.splitlines()[4] == "Sigmoid sig 1 1 a out0" and src.read_text() == TEXT
    assert main(["passes"]) == 0
    assert re.search(rf"^{declared_pass.name}\s+rename every ReLU \(test pass\)\s+\[paramsurgery "
                     rf"{declared_pass.name}\]$", capsys.readouterr().out, re.M)


def test_fix_reduction_flags():
    """fix-reduction's flags live in its command module (a pass imports no command line)."""
    args = build_parser(["fix-reduction", "m.param"]).parse_args(
        ["fix-reduction", "m.param", "--style", "binaryop"])
    assert args.style == "binaryop" and args.partial is False and args.output is None


def test_every_pass_has_its_case_files_and_a_readme_row():
    """Adding a pass is three places: the pass file, its case file(s), its README row."""
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    table = repo.joinpath("README.md").read_text().split("## Passes", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `([\w-]+)` \|", table, re.M))
    missing_cases = [n for n in base.all_passes()
                     if not list((repo / "tests" / "cases" / n.replace("-", "_")).glob("*.case"))]
    missing_rows = [n for n in base.all_passes() if n not in rows]
    assert missing_cases == [] and missing_rows == []
