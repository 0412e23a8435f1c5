"""Passes are data: a pass's options are its dataclass fields (passes/options.py) and its
command's flags are built from them (commands/_pass_commands.py); no pass module imports
argparse or reads a file given on the command line."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from paramsurgery.cli import main
from paramsurgery.commands._pass_commands import add_option_args, pass_from_args
from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.passes.base import all_passes
from paramsurgery.passes.keep_precision import KeepPrecision
from paramsurgery.passes.options import options_of
from paramsurgery.passes.quantize_int8 import Int8Table, QuantizeInt8

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures" / "precision"
BELOW_COMMANDS = ("ir", "formats", "analysis", "patterns", "passes", "lint", "verify", "pipeline")


def test_no_layer_below_the_commands_imports_argparse():
    for pkg in BELOW_COMMANDS:
        for path in (ROOT / "paramsurgery" / pkg).rglob("*.py"):
            tree = ast.parse(path.read_text())
            names = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                     for a in node.names}
            names |= {node.module for node in ast.walk(tree)
                      if isinstance(node, ast.ImportFrom) and node.module}
            assert "argparse" not in names, path


def test_every_pass_command_is_built_from_fields_or_its_own_module():
    """A pass with a tag and no commands/ module gets its flags from its fields: it must be
    a frozen dataclass (its options immutable, the instance hashable data)."""
    commands = {p.stem.replace("_", "-") for p in (ROOT / "paramsurgery" / "commands").glob("*.py")}
    for name, cls in all_passes().items():
        if cls.tag is None or name in commands:
            continue
        assert dataclasses.is_dataclass(cls), name
        assert cls.__dataclass_params__.frozen, name  # type: ignore[attr-defined]


def _parse(cls, argv):  # noqa: ANN001, ANN202
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("param")
    p.add_argument("--bin")
    add_option_args(p, cls)
    return p.parse_args(argv)


def test_flags_round_trip_to_the_instance():
    args = _parse(KeepPrecision, ["m.param", "--layer", "a", "--layer", "b", "--mode", "bf16"])
    assert pass_from_args(KeepPrecision, args) == KeepPrecision(("a", "b"), "bf16")
    assert [f.name for f, _ in options_of(KeepPrecision)] == ["layers", "mode"]
    # a file option is loaded by the command (`load`), the pass receives the table
    args = _parse(QuantizeInt8, ["m.param", "--bin", "m.bin", "--table",
                                 str(FIX / "small_cnn.table"), "--no-requantize"])
    q = pass_from_args(QuantizeInt8, args)
    assert isinstance(q.table, Int8Table) and set(q.table.weights) == {"conv0", "dw1", "pw2", "fc"}
    assert q.requantize is False and q.keep == frozenset()
    with pytest.raises(ParamSurgeryError, match="needs the weights"):
        pass_from_args(QuantizeInt8, _parse(QuantizeInt8, ["m.param", "--table", "t"]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.requantize = True  # type: ignore[misc]


def test_a_missing_required_option_is_usage_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["keep-precision", str(FIX / "planted.param")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage: paramsurgery keep-precision" in err and "--layer" in err


def test_a_number_option_is_parsed_by_argparse(capsys, tmp_path):
    codec = ROOT / "fixtures" / "qwen3_tts" / "tiny" / "codec_decoder.ported.ncnn.param"
    out = tmp_path / "w.param"
    with pytest.raises(SystemExit) as exc:  # was exit 3: int('x') inside the pass
        main(["add-window-cache", str(codec), "--window", "x", "-o", str(out)])
    assert exc.value.code == 2
    assert "argument --window: invalid int value: 'x'" in capsys.readouterr().err
    assert not out.exists()
    assert main(["add-window-cache", str(codec), "--window", "8", "-o", str(out)]) == 0
    assert "window cache of 7 rows" in capsys.readouterr().out
