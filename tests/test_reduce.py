"""`paramsurgery reduce`: planted bugs deep inside the Qwen3-TTS talker decoder are reduced
to a handful of layers, with every failure kind (crash in a child process, load error,
numeric mismatch against a reference graph), through --fails, --check and --predicate;
weights stay byte-exact; outputs, replay log and exit codes.

The real-size talker (850 layers, no .bin: ncnn runs it with zero weights) is used by the
predicate test (no ncnn run) and by the slow tests; the fast ncnn tests use the tiny talker,
which has real weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from paramsurgery.cli import main
from paramsurgery.formats.io import load
from paramsurgery.core.layer_types import is_ncnn_layer
from paramsurgery.repro.reduce import BuiltinCheck, Builder, ValueStore, harvest, reduce_graph
from paramsurgery.runtime.child import Feed, Fetch, run_isolated
from paramsurgery.analysis.validate import validate
from paramsurgery.formats.io import save

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "fixtures" / "qwen3_tts" / "real" / "talker_decoder.ported.ncnn.param"
TINY = ROOT / "fixtures" / "qwen3_tts" / "tiny" / "talker_decoder.ported.ncnn.param"
TINY_BIN = TINY.with_suffix(".bin")
TINY_REF = ROOT / "fixtures" / "qwen3_tts" / "tiny" / "talker_decoder.ported.ref.npz"
MAX_LAYERS = 5

pytestmark = pytest.mark.skipif(not REAL.exists() or not TINY_BIN.exists(),
                                reason="the Qwen3-TTS talker fixtures are not present")


# --------------------------------------------------------------------------- planting

def plant(src: Path, kind: str, out: Path, depth: float = 0.6) -> str:
    """Plant a bug after a residual add `depth` of the way into the decoder; returns the
    name of the planted layer ncnn trips on. Kinds:
    - slice: a Slice with no params (ncnn segfaults) + a Concat putting the halves back;
    - reduction / reduction_ref: x - mean(x) with the mean over the wrong axis (h) / the
      right one (w), same layer and blob names in both;
    - unloadable: a pnnx.Expression (not an ncnn layer: load_param fails)."""
    g = load(src)
    adds = [layer for layer in g.by_type("BinaryOp") if layer.name.startswith("add_")]
    host = adds[int(len(adds) * depth)]
    x = host.outputs[0]
    x2 = g.unique_blob_name(f"{x}_planted")
    g.replace_uses(x, x2)
    if kind == "slice":
        sl = g.add_layer("Slice", "planted_slice", [x], ["planted_s0", "planted_s1"], None,
                         after=host)
        g.add_layer("Concat", "planted_concat", ["planted_s0", "planted_s1"], [x2], {0: 0},
                    after=sl)
        name = "planted_slice"
    elif kind in ("reduction", "reduction_ref"):
        axis = 0 if kind == "reduction" else 1
        r = g.add_layer("Reduction", "planted_mean", [x], ["planted_m"],
                        f"0=3 1=0 -23303=1,{axis} 4=1 5=1", after=host)
        g.add_layer("BinaryOp", "planted_sub", [x, "planted_m"], [x2], {0: 1}, after=r)
        g.insert_splits()
        name = "planted_mean"
    elif kind == "unloadable":
        g.add_layer("pnnx.Expression", "planted_expr", [x], [x2], None, after=host)
        name = "planted_expr"
    else:
        raise ValueError(kind)
    assert not [f for f in validate(g) if f.severity == "error"]
    save(g, out)
    return name


def real_inputs(path: Path, t: int = 4) -> Path:
    rng = np.random.default_rng(0)
    np.savez(path, in0=rng.standard_normal((t, 1024)).astype(np.float32),
             in1=np.triu(np.full((t, t), -np.inf, np.float32), 1),
             in2=rng.standard_normal((t, 128)).astype(np.float32),
             in3=rng.standard_normal((t, 128)).astype(np.float32))
    return path


def tiny_inputs(path: Path) -> Path:
    with np.load(TINY_REF) as z:
        arrays = {f"in{i}": z[f"input_{k}"] for i, k in enumerate(("embeds", "mask", "cos", "sin"))}
    arrays.update({f"batch_index_in{i}": np.array(0, np.int32) for i in range(4)})
    np.savez(path, **arrays)
    return path


def reduced_layers(out: Path) -> list[tuple[str, str]]:
    g = load(out / "reduced.param")
    return [(layer.type, layer.name) for layer in g if layer.type != "Input"]


def run_cli(*argv: str) -> int:
    return main(["reduce", *argv, "-q"])


FOREIGN = textwrap.dedent("""\
    from paramsurgery.core.layer_types import is_ncnn_layer

    def has_foreign(candidate):
        return any(not is_ncnn_layer(layer.type) for layer in candidate.graph)
    """)


# --------------------------------------------------------------------------- building blocks

def test_cut_subgraph_computes_the_same_values_with_exact_weights(tmp_path: Path) -> None:
    """A window cut out of the tiny talker: cut blobs become Inputs with their shapes, the
    weights of every kept layer are the source's bytes, and fed with the values of a full
    run the window computes exactly what the full graph computed."""
    g = load(TINY, TINY_BIN)
    values = ValueStore.from_npz(tiny_inputs(tmp_path / "in.npz"), g.inputs)
    h = harvest(TINY, TINY_BIN, values, g.blob_names(), values)
    assert h.status == "ok" and h.extracted > 50
    b = Builder(g, values, None, tmp_path, has_bin=True)
    window = b.universe[20:40]
    cand = b.build(window)
    assert cand.layers == 20 and cand.cut and not cand.missing
    sub = cand.graph
    assert not [f for f in validate(sub) if f.severity == "error"]
    for blob in cand.cut:
        layer = sub.producer(blob)
        assert layer.type == "Input" and layer.name == f"cut_{blob}"
        assert dict(layer.params.items()) == values.input_params(blob)
    # weights: byte-identical to the source, layer by layer
    reloaded = load(cand.param, cand.bin)
    src = {layer.name: layer for layer in g}
    weighted = 0
    for layer in reloaded:
        if layer.weights is not None and len(layer.weights):
            assert layer.weights.sha256 == src[layer.name].weights.sha256
            weighted += 1
    assert weighted >= 3
    # values: the window alone reproduces the full run's blobs exactly
    run = run_isolated(cand.param, cand.bin, cand.feeds, [Fetch(o) for o in cand.outputs])
    assert run.ok, run.describe()
    for blob in cand.outputs:
        np.testing.assert_array_equal(run.outputs[blob].reshape(values.get(blob)[0].shape),
                                      values.get(blob)[0])


def test_harvest_keeps_values_before_a_crash_and_names_the_blob(tmp_path: Path) -> None:
    bad = tmp_path / "bad.param"
    plant(TINY, "slice", bad, depth=0.5)
    g = load(bad)
    values = ValueStore.from_npz(tiny_inputs(tmp_path / "in.npz"), g.inputs)
    h = harvest(bad, TINY_BIN, values, g.blob_names(), values)
    assert h.status == "crash" and h.signal == 11
    assert h.stopped_at == "planted_s0"
    assert g.producer(h.stopped_at).name == "planted_slice"
    # everything the Slice reads was computed before the crash
    assert all(b in values for b in g.layer("planted_slice").inputs)


# --------------------------------------------------------------------------- fast reductions

def test_reduce_crash_in_child_keeps_weights_exact(tmp_path: Path) -> None:
    bad = tmp_path / "bad.param"
    plant(TINY, "slice", bad)
    out = tmp_path / "out"
    assert run_cli(str(bad), str(TINY_BIN), "--fails", "crash", "--inputs",
                   str(tiny_inputs(tmp_path / "in.npz")), "-o", str(out)) == 0
    layers = reduced_layers(out)
    assert ("Slice", "planted_slice") in layers and len(layers) <= MAX_LAYERS
    # the reduced graph still crashes ncnn, fed with the values written next to it
    g = load(out / "reduced.param")
    with np.load(out / "reduced.inputs.npz") as z:
        feeds = {b: Feed(z[b]) for b in g.inputs}
    run = run_isolated(out / "reduced.param", out / "reduced.bin", feeds,
                       [Fetch(o) for o in g.outputs])
    assert run.status == "crash" and run.signal == 11
    # the largest passing graph is everything before the Slice, weights byte-exact
    passing = load(out / "passing.param", out / "passing.bin")
    assert "planted_slice" not in {layer.name for layer in passing}
    assert len(passing) > 40
    rep = json.loads((out / "replay.json").read_text())
    assert rep["result"]["weights_layers_checked"] > 10
    assert rep["steps"][0]["phase"] == "source" and rep["steps"][0]["result"] == "fail"
    assert rep["check"]["kind"] == "crash" and rep["check"]["signal"] == 11
    assert rep["result"]["reduced_layer_names"] == [n for _, n in layers]


CHECK_SCRIPT = textwrap.dedent("""\
    # a user's check: run the graph in-process with paramsurgery's runtime, so an ncnn
    # crash kills this process (the reducer must survive and see the signal)
    import sys
    import numpy as np
    from paramsurgery.formats.io import load
    from paramsurgery.runtime.child import Feed, run

    param, binp, inputs = sys.argv[1:4]
    g = load(param)
    with np.load(inputs) as z:
        feeds = {b: Feed(z[b], int(z["batch_index_" + b]) if "batch_index_" + b in z.files
                         else 233) for b in g.inputs}
    run(param, binp or None, feeds, g.outputs)
    print("ran fine")
    """)


def test_reduce_check_command_survives_a_crashing_check(tmp_path: Path) -> None:
    bad = tmp_path / "bad.param"
    plant(TINY, "slice", bad)
    script = tmp_path / "check.py"
    script.write_text(CHECK_SCRIPT)
    out = tmp_path / "out"
    env_pp = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + env_pp if env_pp else "")
    try:
        code = run_cli(str(bad), str(TINY_BIN), "--check",
                       f"{sys.executable} {script} {{param}} {{bin}} {{inputs}}",
                       "--fail-code", "-11", "--inputs", str(tiny_inputs(tmp_path / "in.npz")),
                       "-o", str(out))
    finally:
        if env_pp:
            os.environ["PYTHONPATH"] = env_pp
        else:
            os.environ.pop("PYTHONPATH")
    assert code == 0
    layers = reduced_layers(out)
    assert ("Slice", "planted_slice") in layers and len(layers) <= MAX_LAYERS
    rep = json.loads((out / "replay.json").read_text())
    assert rep["check"]["check"] == "command"
    assert all("SIGSEGV" in s["detail"] for s in rep["steps"] if s["result"] == "fail")


def test_reduce_mismatch_against_reference_tiny(tmp_path: Path) -> None:
    bad, ref = tmp_path / "bad.param", tmp_path / "ref.param"
    plant(TINY, "reduction", bad)
    plant(TINY, "reduction_ref", ref)
    out = tmp_path / "out"
    assert run_cli(str(bad), str(TINY_BIN), "--fails", "mismatch", "--reference", str(ref),
                   "--reference-bin", str(TINY_BIN), "--inputs",
                   str(tiny_inputs(tmp_path / "in.npz")), "-o", str(out)) == 0
    layers = reduced_layers(out)
    assert ("Reduction", "planted_mean") in layers and len(layers) <= MAX_LAYERS
    rep = json.loads((out / "replay.json").read_text())
    assert "mismatch" in rep["result"]["reduced_verdict"]


def test_reduce_predicate_on_the_real_talker(tmp_path: Path) -> None:
    """Real size, no ncnn: a predicate that fails while a non-ncnn layer is present."""
    bad = tmp_path / "bad.param"
    plant(REAL, "unloadable", bad)
    pred = tmp_path / "pred.py"
    pred.write_text(FOREIGN)
    out = tmp_path / "out"
    assert run_cli(str(bad), "--predicate", f"{pred}:has_foreign", "-o", str(out)) == 0
    assert reduced_layers(out) == [("pnnx.Expression", "planted_expr")]
    g = load(out / "reduced.param")
    assert [layer.type for layer in g] == ["Input", "pnnx.Expression"]
    assert all(is_ncnn_layer(layer.type) for layer in load(out / "passing.param"))
    rep = json.loads((out / "replay.json").read_text())
    assert rep["result"]["source_layers"] == 847
    assert rep["runs"] <= 20


def test_linear_mode_reaches_the_same_result(tmp_path: Path) -> None:
    bad = tmp_path / "bad.param"
    plant(TINY, "unloadable", bad, depth=0.9)
    pred = tmp_path / "pred.py"
    pred.write_text(FOREIGN)
    out = tmp_path / "out"
    assert run_cli(str(bad), "--predicate", f"{pred}:has_foreign", "--mode", "linear",
                   "-o", str(out)) == 0
    assert reduced_layers(out) == [("pnnx.Expression", "planted_expr")]
    rep = json.loads((out / "replay.json").read_text())
    assert {s["phase"] for s in rep["steps"]} >= {"outputs-linear", "inputs-linear"}
    assert "outputs-bisect" not in {s["phase"] for s in rep["steps"]}


def test_replay_reuses_every_verdict(tmp_path: Path) -> None:
    bad = tmp_path / "bad.param"
    plant(TINY, "unloadable", bad)
    pred = tmp_path / "pred.py"
    pred.write_text(FOREIGN)
    out1, out2 = tmp_path / "a", tmp_path / "b"
    assert run_cli(str(bad), "--predicate", f"{pred}:has_foreign", "-o", str(out1)) == 0
    assert main(["reduce", str(bad), "--predicate", f"{pred}:has_foreign", "--replay",
                 str(out1 / "replay.json"), "-o", str(out2), "-q", "--format", "json"]) == 0
    rep = json.loads((out2 / "replay.json").read_text())
    assert rep["runs"] == 0 and all(s["replayed"] for s in rep["steps"])
    assert (out1 / "reduced.param").read_bytes() == (out2 / "reduced.param").read_bytes()


def test_source_that_does_not_fail_exits_1(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    assert run_cli(str(TINY), "--fails", "load-error", "-o", str(out)) == 1
    assert "does not fail" in capsys.readouterr().err
    assert not (out / "reduced.param").exists()
    rep = json.loads((out / "replay.json").read_text())
    assert rep["steps"][0]["result"] == "pass"


@pytest.mark.parametrize("argv, message", [
    (["--fails", "mismatch"], "needs --reference"),
    (["--fails", "crash", "--fail-code", "3"], "--fail-code applies to --check only"),
    (["--predicate", "nomodule"], "expected module:function"),
    (["--predicate", "json:no_such_fn"], "has no function"),
    (["--fails", "crash", "--inputs", "/nonexistent.npz"], "cannot read inputs"),
])
def test_usage_errors_exit_2(tmp_path: Path, capsys, argv: list[str], message: str) -> None:  # noqa: ANN001
    assert main(["reduce", str(TINY), *argv, "-o", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err


def test_crash_kind_needs_inputs_or_input_shapes(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert main(["reduce", str(TINY), "--fails", "crash", "-o", str(tmp_path / "o")]) == 2
    assert "give --inputs" in capsys.readouterr().err


def test_builtin_check_distinguishes_failure_kinds(tmp_path: Path) -> None:
    """A load error is not a crash: reducing a crash never drifts to a load failure."""
    bad = tmp_path / "bad.param"
    plant(TINY, "unloadable", bad)
    g = load(bad)
    b = Builder(g, ValueStore(), None, tmp_path, has_bin=False)
    cand = b.build(b.universe)
    assert BuiltinCheck("load-error")(cand).result == "fail"
    assert BuiltinCheck("crash")(cand).result == "unknown"  # no input values at all
    assert BuiltinCheck("any")(cand).result == "unknown"


# --------------------------------------------------------------------------- slow: real size

@pytest.mark.slow
def test_real_talker_parameterless_slice_crash(tmp_path: Path) -> None:
    bad = tmp_path / "bad.param"
    plant(REAL, "slice", bad)
    out = tmp_path / "out"
    res = reduce_graph(bad, None, BuiltinCheck("crash"), out_dir=out,
                       inputs=real_inputs(tmp_path / "in.npz"))
    layers = reduced_layers(out)
    assert ("Slice", "planted_slice") in layers and len(layers) <= MAX_LAYERS
    assert res.result.source_layers == 848


@pytest.mark.slow
def test_real_talker_wrong_axis_reduction_mismatch(tmp_path: Path) -> None:
    bad, ref = tmp_path / "bad.param", tmp_path / "ref.param"
    plant(REAL, "reduction", bad)
    plant(REAL, "reduction_ref", ref)
    out = tmp_path / "out"
    # zero weights (no .bin) make the decoder's output 0 whatever happens inside: compare
    # every blob, not just the output
    reduce_graph(bad, None, BuiltinCheck("mismatch", compare="all"), out_dir=out,
                 inputs=real_inputs(tmp_path / "in.npz"), reference=ref)
    layers = reduced_layers(out)
    assert ("Reduction", "planted_mean") in layers and len(layers) <= MAX_LAYERS


@pytest.mark.slow
def test_real_talker_unloadable_layer(tmp_path: Path) -> None:
    bad = tmp_path / "bad.param"
    plant(REAL, "unloadable", bad)
    out = tmp_path / "out"
    reduce_graph(bad, None, BuiltinCheck("load-error"), out_dir=out)
    assert reduced_layers(out) == [("pnnx.Expression", "planted_expr")]


@pytest.mark.slow
def test_real_talker_check_command_crash(tmp_path: Path) -> None:
    bad = tmp_path / "bad.param"
    plant(REAL, "slice", bad)
    script = tmp_path / "check.py"
    script.write_text(CHECK_SCRIPT)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "paramsurgery", "reduce", str(bad), "--check",
         f"{sys.executable} {script} {{param}} {{bin}} {{inputs}}", "--inputs",
         str(real_inputs(tmp_path / "in.npz")), "-o", str(out)],
        capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    layers = reduced_layers(out)
    assert ("Slice", "planted_slice") in layers and len(layers) <= MAX_LAYERS
    assert "reduced 848 ->" in proc.stdout
