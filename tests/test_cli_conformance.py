"""One argument convention for every command (issue 25, item 5): every command of README's
table takes the model positionally and `--bin`, `-` for stdin, the model after
`--inputshape NAME=[..] ...`, prints its own usage (and the closest options) on a bad
option, and prints JSON matching its schema (`paramsurgery/commands/_schemas.py`)."""

import io
import json
import re
import sys

import jsonschema
import pytest

from paramsurgery.cli import build_parser, main
from paramsurgery.commands._common import command_parser, normalize_argv, resolve_bin
from paramsurgery.commands._schemas import SCHEMAS, schema_of

from conftest import CORPUS, REPO

F = REPO / "fixtures"
TALKER = F / "qwen3_tts/tiny/talker_decoder.ported.ncnn"
CONV = F / "streaming/causal_conv.ncnn"
EMBEDS = F / "fusions/embeds3.sum.ncnn"
GELU = F / "rewrite/gelu_tanh"
TALKER_SHAPES = ["in0=[T,64]", "in1=[T,T]", "in2=[T,16]", "in3=[T,16]"]


def _t(name):
    return str(TALKER) + name


# command -> how to run it on a real file: the model, its weights, the arguments after the
# model ({out}: a scratch directory), the exit code; `stdin=False`: the command reads no
# model (passes, repro); "kv": the talker with its kv cache (made once, below)
CASES = {
    "demo": dict(model=_t(".param"), bin=_t(".bin"), rest=[]),
    "info": dict(model=_t(".param"), bin=_t(".bin"), rest=[]),
    "shapes": dict(model=_t(".param"), bin=_t(".bin"), rest=[]),
    "validate": dict(model=_t(".param"), bin=_t(".bin"), rest=[]),
    "lint": dict(model=_t(".param"), bin=_t(".bin"), rest=["--no-run"]),
    "compare": dict(model=_t(".param"), bin=_t(".bin"),
                    rest=["--reference", _t(".param"), "--at", "T=5",
                          "--inputshape", *TALKER_SHAPES]),
    "fmt": dict(model=_t(".param"), bin=_t(".bin"), rest=["-o", "{out}/f.param"]),
    "synth-bin": dict(model=_t(".param"), bin="{out}/s.bin", rest=[]),
    "add-kvcache": dict(model=_t(".param"), bin=_t(".bin"), rest=["-o", "{out}/kv.param"]),
    "verify-kvcache": dict(model="kv", bin="kv.bin", rest=["--m", "2"]),
    "fold-explicit-cache": dict(model=_t(".param"), bin=_t(".bin"), rest=["-o", "{out}/o.param"]),
    "fix": dict(model=_t(".param"), bin=_t(".bin"), rest=["-o", "{out}/o.param"]),
    "fix-reduction": dict(model=_t(".param"), bin=_t(".bin"), rest=["-o", "{out}/o.param"]),
    "fix-slice": dict(model=_t(".param"), bin=_t(".bin"), rest=["-o", "{out}/o.param"]),
    "dynamize": dict(model=_t(".param"), bin=_t(".bin"),
                     rest=["--traced-len", "7", "-o", "{out}/o.param"]),
    "fix-batch-reshape": dict(model=_t(".param"), bin=_t(".bin"), rest=["-o", "{out}/o.param"]),
    "fix-tied-linear": dict(model=str(F / "encoder/tied_head.param"),
                            bin=str(F / "encoder/tied_head.bin"), rest=["-o", "{out}/o.param"]),
    "fix-pow": dict(model=_t(".param"), bin=_t(".bin"), rest=["-o", "{out}/o.param"]),
    "fix-lossy-reshape": dict(model=str(F / "encoder/broadcast_table.ncnn.param"),
                              bin=str(F / "encoder/broadcast_table.ncnn.bin"),
                              rest=["--pnnx", str(F / "encoder/broadcast_table.pnnx.param"),
                                    "-o", "{out}/o.param"]),
    "fuse-codebooks": dict(model=str(EMBEDS) + ".param", bin=str(EMBEDS) + ".bin",
                           rest=["-o", "{out}/fused"]),
    "fold-gqa": dict(model=_t(".param"), bin=_t(".bin"), rest=["-o", "{out}/o.param"]),
    "extract": dict(model=_t(".param"), bin=_t(".bin"),
                    rest=["--outputs", "out0", "-o", "{out}/sub"]),
    "add-conv-cache": dict(model=str(CONV) + ".param", bin=str(CONV) + ".bin",
                           rest=["-o", "{out}/stream"]),
    "stream-check": dict(model=str(CONV) + ".param", bin=str(CONV) + ".bin", rest=[]),
    "set-param": dict(model=_t(".param"), bin=_t(".bin"),
                      rest=["--layer", "rmsn_20", "1=0.5", "-o", "{out}/o.param"]),
    "lower": dict(model=_t(".param"), bin=_t(".bin"), rest=["-o", "{out}/o.param"]),
    "remove-passthrough": dict(model=_t(".param"), bin=_t(".bin"), rest=["-o", "{out}/o.param"]),
    "merge-inputs": dict(model="kv", bin="kv.bin", rest=["--kv-cache", "-o", "{out}/o.param"]),
    "rename-blobs": dict(model=_t(".param"), bin=_t(".bin"),
                         rest=["in0=embeds", "-o", "{out}/o.param"]),
    "insert": dict(model=_t(".param"), bin=_t(".bin"),
                   rest=["--after", "rmsn_20", "--type", "ReLU", "--name", "r1",
                         "-o", "{out}/o.param"]),
    "repro list": dict(model=None, rest=[]),
    "repro check": dict(model=None, rest=["no-such-case"], code=2),
    "repro issue": dict(model=None, rest=["1", "-o", "{out}/issue"]),
    "reduce": dict(model="bad", bin=None, rest=["--fails", "load-error", "-o", "{out}/red"]),
    "view": dict(model=_t(".param"), bin=_t(".bin"), rest=["-o", "{out}/v.html"]),
    "diff": dict(model=_t(".param"), bin=_t(".bin"), rest=[_t(".param"), "--bin-b", _t(".bin")]),
    "rewrite": dict(model=str(GELU) + ".param", bin=None,
                    rest=["--rule", str(GELU) + ".rule", "--inputshape", "in0=[T,16]",
                          "-o", "{out}/o.param"]),
    "fold-constant-layout": dict(model=_t(".param"), bin=_t(".bin"),
                                 rest=["-o", "{out}/o.param"]),
    "passes": dict(model=None, rest=[]),
    "precision": dict(model=_t(".param"), bin=_t(".bin"),
                      rest=["--mode", "fp16", "--at", "T=5", "--inputshape", *TALKER_SHAPES],
                      code=1),  # exit 1: layers that break in fp16 (the report names them)
    "quantize": dict(model=_t(".param"), bin=_t(".bin"),
                     rest=["--calib", str(TALKER)[: -len(".ncnn")] + ".ref.npz", "--method", "max",
                           "-o", "{out}/q.param"]),
    "quantize-int8": dict(model=str(F / "precision/small_cnn.param"),
                          bin=str(F / "precision/small_cnn.bin"),
                          rest=["--table", str(F / "precision/small_cnn.table"),
                                "-o", "{out}/q.param"]),
    "keep-precision": dict(model=_t(".param"), bin=_t(".bin"),
                           rest=["--layer", "rmsn_20", "--mode", "fp16", "-o", "{out}/o.param"]),
}


def readme_commands() -> set[str]:
    """The commands named in README's command table (`a` / `b` rows, `repro x|y|z`)."""
    text = (REPO / "README.md").read_text()
    table = text.split("## Commands", 1)[1].split("\n\n", 2)[1]
    names: set[str] = set()
    for row in table.splitlines()[2:]:
        cell = row.split(" | ")[0]
        for code in re.findall(r"`([^`]+)`", cell):
            words = code.split()
            word = words[1] if words[0] == "paramsurgery" else words[0]
            if word == "repro":
                names |= {f"repro {w}" for w in words[2].replace("\\", "").split("|")}
            else:
                names.add(word)
    return names


def test_every_command_of_the_readme_table_has_a_case():
    assert readme_commands() == set(CASES) - set(), sorted(readme_commands() ^ set(CASES))
    assert set(SCHEMAS) >= set(CASES)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The kv-cache talker and a graph ncnn cannot load (reduce's input)."""
    d = tmp_path_factory.mktemp("conformance")
    assert main(["add-kvcache", _t(".param"), "--bin", _t(".bin"), "-o",
                 str(d / "kv.param"), "-q"]) == 0
    (d / "bad.param").write_text("7767517\n3 3\nInput in0 0 1 in0 0=4\nReLU r 1 1 in0 a\n"
                                 "FooBar f 1 1 a out0\n")
    return {"kv": str(d / "kv.param"), "kv.bin": str(d / "kv.bin"),
            "bad": str(d / "bad.param")}


def _argv(cmd, case, files, out, model=None, with_bin=True):
    model = model if model is not None else files.get(case["model"], case["model"])
    argv = cmd.split() + ([model] if model else [])
    b = case.get("bin")
    if with_bin and b:
        argv += ["--bin", files.get(b, b).replace("{out}", str(out))]
    return argv + [a.replace("{out}", str(out)) for a in case["rest"]]


def _model_of(args):
    return args.a if args.command == "diff" else args.param


def _parse(argv):
    argv = normalize_argv(argv)
    parser = build_parser(argv)
    args, extras = parser.parse_known_args(argv)
    assert not extras, extras
    return parser, args


@pytest.mark.parametrize("cmd", [c for c in CASES if CASES[c]["model"]])
def test_model_positional_and_bin(cmd, files, tmp_path):
    case = CASES[cmd]
    model = files.get(case["model"], case["model"])
    n = len(cmd.split())
    plain = _argv(cmd, case, files, tmp_path, with_bin=False)
    _, args = _parse(plain[:n + 1] + ["--bin", "W.bin"] + plain[n + 1:])
    assert _model_of(args) in (model, [model])
    resolve_bin(args)
    weights = args.output if cmd == "synth-bin" else getattr(args, "bin_a", None) or args.bin
    assert weights == "W.bin"
    # where a command had a positional .bin, it stays, as an alias of --bin
    if hasattr(args, "bin_positional"):
        _, alias = _parse(plain[:n + 1] + ["W.bin"] + plain[n + 1:])
        resolve_bin(alias)
        assert alias.bin == "W.bin"


@pytest.mark.parametrize("cmd", [c for c in CASES if CASES[c]["model"]])
def test_model_after_inputshape_items(cmd, files, tmp_path):
    case = CASES[cmd]
    argv = _argv(cmd, case, files, tmp_path)
    parser, args = _parse(argv)
    sub = command_parser(parser, args)
    if not any("--inputshape" in a.option_strings for a in sub._actions):
        pytest.skip(f"{cmd} takes no --inputshape")
    n = len(cmd.split())
    moved = argv[:n] + ["--inputshape", "in0=[T,64]", "in1=[T,T]"] + argv[n:]
    _, args = _parse(moved)
    model = files.get(case["model"], case["model"])
    assert _model_of(args) in (model, [model])
    assert args.inputshape[:2] == ["in0=[T,64]", "in1=[T,T]"]


@pytest.mark.parametrize("cmd", sorted(CASES))
def test_bad_option_prints_the_commands_own_usage(cmd, files, tmp_path, capsys):
    argv = _argv(cmd, CASES[cmd], files, tmp_path) + ["--formt", "json"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: paramsurgery {cmd} "), err
    assert "unrecognized arguments: --formt json" in err
    assert "--formt: did you mean --format?" in err


@pytest.mark.parametrize("argv", [["set-param", "M", "0=1", "--layr", "x"],
                                  ["compare", "M", "--refrence", "B.param"],
                                  ["extract", "M", "--outputz", "out0"]])
def test_a_typo_is_named_before_a_missing_required_argument(argv, capsys):
    # argparse checks required arguments first: the typo of the option that supplies one
    # would otherwise read as "--layer is required"
    model = str(F / "qwen3_tts" / "tiny" / "talker_decoder.ported.ncnn.param")
    with pytest.raises(SystemExit) as exc:
        main([model if a == "M" else a for a in argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: paramsurgery {argv[0]} "), err
    typo = argv[-2]
    assert f"unrecognized arguments: {typo}" in err
    assert f"{typo}: did you mean --" in err


class _Stdin:
    def __init__(self, data: bytes):
        self.buffer = io.BytesIO(data)


@pytest.mark.parametrize("cmd", sorted(CASES))
def test_json_matches_its_schema_reading_stdin(cmd, files, tmp_path, capsys, monkeypatch):
    case = CASES[cmd]
    model = files.get(case["model"], case["model"]) if case["model"] else None
    if model and cmd not in ("demo",):  # the model from stdin ('-')
        from pathlib import Path

        monkeypatch.setattr(sys, "stdin", _Stdin(Path(model).read_bytes()))
        argv = _argv(cmd, case, files, tmp_path, model="-")
    else:
        argv = _argv(cmd, case, files, tmp_path)
    code = main(argv + ["--format", "json"])
    out, err = capsys.readouterr()
    assert code == case.get("code", 0), err
    if code == 2:  # an error is `file: message` on stderr, no JSON
        assert out == "" and ": " in err
        return
    data = json.loads(out)
    jsonschema.validate(data, schema_of(cmd))
    if model and cmd != "demo":  # the model read from stdin is named so, not by a temp path
        listed = [f.get("file") for f in data.get("files", [])] + \
            data.get("summary", {}).get("passing", []) + data.get("summary", {}).get("failing", [])
        assert "<stdin>" in listed, data.get("files")
        assert "paramsurgery-stdin-" not in json.dumps(data)


def test_stdin_to_stdout_and_located_errors(capsys, monkeypatch):
    text = (CORPUS / "squeezenet.param").read_bytes()
    monkeypatch.setattr(sys, "stdin", _Stdin(text))
    assert main(["fmt", "-"]) == 0  # default output of a stdin model: stdout
    out = capsys.readouterr().out
    assert out.startswith("7767517\n") and "Convolution" in out
    monkeypatch.setattr(sys, "stdin", _Stdin(b"7767517\n1 1\nInput in 0 1 a 0=\n"))
    assert main(["info", "-"]) == 2
    assert capsys.readouterr().err.startswith("<stdin>:3:")


def test_set_param_takes_negative_ids_and_an_unknown_command_gets_suggestions(tmp_path, capsys):
    out = tmp_path / "o.param"
    assert main(["set-param", _t(".param"), "--layer", "unsqueeze_41", "-23303=1,1",
                 "-o", str(out)]) == 0  # an array key written as is, no `--` needed
    assert "unsqueeze_41             1 1 in2 23 -23303=1,1\n" in out.read_text()
    # an array given for a scalar param is refused, not written as an array
    assert main(["set-param", _t(".param"), "--type", "Gemm", "10=1,0.2", "-o", str(out)]) == 2
    assert "int param, but the value is a list" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["add-kvcach", _t(".param")])
    assert "did you mean add-kvcache" in capsys.readouterr().err
