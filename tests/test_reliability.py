"""Issue 14, one test per item: hostile input never gives an internal error, a hang, a
stray file, or a disagreement with ncnn's own loader."""

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import paramsurgery
from paramsurgery import ParamSurgeryError
from paramsurgery.cli import main
from paramsurgery.core.fs import Terminated
from paramsurgery.runtime.loader import load_verdicts

from conftest import REPO
from fuzz_harness import run_cli
from paramsurgery.formats.param_text import dump_bytes

SPLIT_CYCLE = b"7767517\n3 4\nInput in 0 1 a\nSplit s 1 1 x x\nBinaryOp add 2 1 a x y 0=0\n"
SIMPLE = b"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b\n"


def write(tmp_path, data: bytes, name="m.param") -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


# 1 ------------------------------------------------------------------------ cycles
@pytest.mark.parametrize("cmd", [["lint"], ["fix", "-o", "OUT"], ["fuse-codebooks", "-o", "OUT"],
                                 ["fold-gqa", "-o", "OUT"], ["lower", "-o", "OUT"]])
def test_walks_terminate_on_cycles_and_report_them(tmp_path, cmd):
    p = write(tmp_path, SPLIT_CYCLE)
    assert load_verdicts([SPLIT_CYCLE])[0].loads  # ncnn loads it
    argv = [cmd[0], p] + [str(tmp_path / "o.param") if a == "OUT" else a for a in cmd[1:]]
    code, out, err = run_cli(argv, timeout=30)
    assert code in (0, 1, 2), (code, err)
    if cmd[0] == "lint":
        assert "PS105 error layer 's' reads its own top 'x' (a cycle)" in out


def test_embed_sum_walk_with_a_cycle(tmp_path):
    data = (b"7767517\n4 6\nInput in 0 2 a c\nEmbed e 1 1 c y 0=4 1=8 3=32\n"
            b"Split s 1 1 x x\nBinaryOp add 2 1 a x y 0=0\n")
    code, out, _ = run_cli(["lint", "--no-run", write(tmp_path, data)], timeout=30)
    assert code == 1 and "PS105" in out


# 2 ------------------------------------------------------------------------ huge integers
@pytest.mark.parametrize("data,line", [
    (b"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b 0=" + b"9" * 5000 + b"\n", 4),
    (b"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b -23300=" + b"9" * 5000 + b",1\n", 4),
    (b"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b " + b"1" * 5000 + b"=1\n", 4),
    (b"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b 0=1," + b"9" * 5000 + b"\n", 4),
    (b"9" * 5000 + b"\n2 2\nInput in 0 1 a\n", 1),
    (b"7767517\n" + b"9" * 5000 + b" 2\nInput in 0 1 a\n", 2),
    (b"7767517\n2 2\nInput in 0 1 a\nReLU r " + b"1" * 5000 + b" 1 a b\n", 4),
])
def test_huge_integer_tokens_are_located_errors(tmp_path, data, line):
    p = write(tmp_path, data)
    assert not load_verdicts([data])[0].loads
    for argv in (["lint", p], ["fmt", p, "-o", str(tmp_path / "o.param")], ["info", p]):
        code, _, err = run_cli(argv)
        assert code == 2, (argv, err)
        assert err.startswith(f"{p}:{line}:"), err
        assert len(err) < 1000  # the token is not echoed whole


# 3 ------------------------------------------------------------------------ header counts
def test_fmt_counts_blobs_as_ncnn_does(tmp_path):
    data = b"7767517\n3 3\nInput in 0 1 a\nReLU r1 1 1 a b\nReLU r2 1 1 a b\n"
    assert load_verdicts([data])[0].loads
    out = tmp_path / "o.param"
    assert main(["fmt", write(tmp_path, data), "-o", str(out)]) == 0
    assert out.read_bytes().split(b"\n")[1] == b"3 3"  # one blob per top: b twice
    assert load_verdicts([out.read_bytes()])[0].loads
    g = paramsurgery.loads(b"7767517\n2 3\nInput in 0 1 a\nReLU r 1 1 x b\n")
    assert g.blob_count() == 3  # a dangling bottom makes a blob too


def test_header_only_file_keeps_its_header(tmp_path):
    out = tmp_path / "o.param"
    assert main(["fmt", write(tmp_path, b"7767517\n1 1\n"), "-o", str(out)]) == 0
    assert out.read_bytes() == b"7767517\n1 1\n"


def test_every_writer_keeps_a_loadable_file_loadable(tmp_path):
    """Each rewriting command on files ncnn loads (the corpus): its output loads too."""
    from conftest import corpus_params

    outs = []
    for src in corpus_params()[:12]:
        for cmd in (["fmt"], ["fix", "--always-write"], ["remove-passthrough"]):
            out = tmp_path / f"{src.stem}.{cmd[0]}.param"
            code, _, err = run_cli(cmd + [str(src), "-o", str(out)])
            if code in (0, 1) and out.exists():
                outs.append((src, cmd[0], out.read_bytes()))
            else:
                assert code == 2, err
    ins = load_verdicts([s.read_bytes() for s, _, _ in outs])
    got = load_verdicts([o for _, _, o in outs])
    bad = [(s.name, c, g.message) for (s, c, _), i, g in zip(outs, ins, got)
           if i.loads and not g.loads]
    assert not bad


# 4 ------------------------------------------------------------------------ grammar
@pytest.mark.parametrize("data", [
    b"7767517\n2 2 Input in 0 1 a\nReLU r 1 1 a b\n",
    b"7767517 2 2 Input in 0 1 a\nReLU r 1 1 a b 0=1\n",
    b"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b 0=a\"b 1=ab\" 2=a,b\"c\n",
    b"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b -0=1 -00=2 031=1\n",
    b"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b -23300=+1,5 -23301=-0 -023302=1,2\n",
    b"7767517\n1 1\nInput in +0 01 a\n",
    b"7767517\n1 1\nInput in -0 1 a\n",
    b"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b 0=" + b"0" * 126 + b"1\n",
    b"7767517\n1 1000000\nInput in 0 1 a\n",
])
def test_reader_accepts_what_ncnn_loads_byte_exact(data):
    assert load_verdicts([data])[0].loads
    g = paramsurgery.loads(data, "m.param")
    for layer in g:
        layer.params.check()
    assert dump_bytes(g) == data


def test_first_layer_on_the_header_line_keeps_positions():
    g = paramsurgery.loads(b"7767517\n2 2 Input in 0 1 a\nReLU r 1 1 a b\n")
    assert [x.source_line for x in g] == [2, 3]
    with pytest.raises(ParamSurgeryError) as info:
        paramsurgery.loads(b"7767517\n2 2  Input in 0 1 a\nReLU r 1 1 a b 0=,\n", "m.param")
    assert info.value.line == 3
    with pytest.raises(ParamSurgeryError) as info:
        paramsurgery.loads(b"7767517\n2 2  Input in 0 1 a 0=1x\nReLU r 1 1 a b\n", "m.param")
    assert (info.value.line, info.value.col) == (2, len("2 2  Input in 0 1 a ") + 1)


@pytest.mark.parametrize("data,line", [
    (b"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b 0=" + b"0" * 127 + b"1\n", 4),
    (b"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b " + b"0" * 15 + b"1=1\n", 4),
    (b"7767517\n1 1\nInput in 0 " + b"0" * 31 + b"1 a\n", 3),
    (b"7767517\n1 1000001\nInput in 0 1 a\n", 2),
    (b"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b 0=\"ab\"c\n", 4),
    (b"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b 1=" + b"a" * 256 + b"\n", 4),
])
def test_reader_rejects_what_ncnn_rejects(data, line):
    assert not load_verdicts([data])[0].loads
    with pytest.raises(ParamSurgeryError) as info:
        g = paramsurgery.loads(data, "m.param")
        for layer in g:
            layer.params.check()
    assert info.value.line == line


@pytest.mark.parametrize("data,line,message", [
    (b"7767517\n2 2\nInput in 0 1 a\nPooling p 1 1 a b 2=2\n", 4, "layer load_param 1 p failed"),
    (b"7767517\n2 2\nInput in 0 1 a\nReLU r 2 1 a a b\n", 4, "one_blob_only layer 1"),
    (b"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b -23331=1,1\n", 4, "invalid feature mask"),
    (b"7767517\n2 2\nInput in 0 1 a\nSoftmax s 1 1 a b 0=1\n", 4, "layer load_param 1 s"),
])
def test_lint_reports_ncnns_own_message_on_the_line(tmp_path, data, line, message):
    p = write(tmp_path, data)
    code, out, _ = run_cli(["lint", p], timeout=60)
    assert code == 1
    errors = [ln for ln in out.splitlines() if ln.startswith(f"{p}:{line}: ") and " error " in ln]
    assert errors, out
    # ncnn's own words, unless a more specific rule already reports this line
    if not any("PS112" not in ln for ln in errors):
        assert "PS112 error ncnn's loader rejects this file: " in out and message in out


def test_no_false_error_past_the_header_count(tmp_path):
    data = b"7767517\n2 2\nInput in 0 1 a\nReLU r 1 1 a b\nMyLayer m 1 1 b c\n"
    assert load_verdicts([data])[0].loads
    code, out, _ = run_cli(["lint", write(tmp_path, data)], timeout=60)
    assert code == 0, out
    assert "PS005 info" in out and "past the header's layer count" in out


# 5 ------------------------------------------------------------------------ long arrays
RSS_SCRIPT = textwrap.dedent("""
    import os, resource, sys
    import paramsurgery
    from paramsurgery.formats.io import load
    from paramsurgery.formats.normalize import normalize
    path, count = sys.argv[1], int(sys.argv[2])
    size = os.path.getsize(path)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    g = load(path)
    for layer in g:
        layer.params.check()
    assert len(g.layer("m").params.value(0)) == count
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    data = paramsurgery.dump_bytes(g)
    assert data == open(path, "rb").read()
    del data
    normalize(g)  # what `fmt` writes: every element respelled
    data = paramsurgery.dump_bytes(g)
    written = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print((loaded - base) * 1024 / size, (written - base) * 1024 / size)
""")

N_LONG = 1_000_000
LONG_LAYOUTS = {  # every element's spelling decides the bytes per element
    "ints": lambda i: "1",
    "floats": lambda i: "0.5",
    "negative_ints": lambda i: "-1",
    "scientific": lambda i: "1e-3",
    "mixed": lambda i: "1" if (i * 7919) % 3 == 0 else "0.5",
}


@pytest.mark.parametrize("layout,style", [
    pytest.param(k, style, marks=[] if k in ("ints", "mixed") and style == "old" else
                 pytest.mark.slow) for k in LONG_LAYOUTS for style in ("old", "new")])
def test_long_array_peak_memory_is_bounded(tmp_path, layout, style):
    if style == "new" and layout == "mixed":
        pytest.skip("a new-style array cannot mix (its first element decides)")
    elems = ",".join(LONG_LAYOUTS[layout](i) for i in range(N_LONG))
    token = f"-23300={N_LONG},{elems}" if style == "old" else f"0={elems}"
    p = tmp_path / "long.param"
    p.write_text(f"7767517\n2 2\nInput in 0 1 a\nMemoryData m 0 1 b {token}\n")
    del elems, token
    r = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(p), str(N_LONG)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr
    after_load, after_write = map(float, r.stdout.split())
    assert after_load <= 10.0 and after_write <= 10.0, r.stdout  # ncnn itself: ~6x


# 6 ------------------------------------------------------------------------ write failures
EXPLICIT_CACHE = (b"7767517\n6 13\nInput in0 0 6 q k v past_k past_v mask\n"
                  b"Concat cat_k 2 1 past_k k kk 0=1\nSplit split_k 1 2 kk kk_0 present_k\n"
                  b"Concat cat_v 2 1 past_v v vv 0=1\nSplit split_v 1 2 vv vv_0 present_v\n"
                  b"SDPA sdpa_0 4 1 q kk_0 vv_0 mask out0 5=1\n")


@pytest.mark.parametrize("cmd", [["fmt"], ["fix", "--always-write"], ["fold-explicit-cache"],
                                 ["remove-passthrough"],
                                 ["synth-bin"], ["rename-blobs", "b=c"],
                                 ["extract", "--outputs", "b"]])
@pytest.mark.parametrize("where", ["missing_dir", "a_directory"])
def test_write_failures_exit_2_naming_the_path(tmp_path, cmd, where):
    src = write(tmp_path, EXPLICIT_CACHE if cmd[0] == "fold-explicit-cache" else SIMPLE)
    out = tmp_path / "nope" / "o.param" if where == "missing_dir" else tmp_path / "d.param"
    if where == "a_directory":
        out.mkdir()
        if cmd[0] in ("synth-bin", "extract"):
            return  # synth-bin refuses an existing path; extract writes PATH.param
    code, _, err = run_cli([cmd[0], src, "-o", str(out)] + cmd[1:])
    assert code == 2, err
    assert err.startswith(f"{out}: cannot write: "), err


def test_disk_full_exits_2_and_leaves_no_temp_file(tmp_path, monkeypatch):
    import paramsurgery.core.fs as io

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(io.os, "fsync", full)
    src = write(tmp_path, SIMPLE)
    out = tmp_path / "out" / "o.param"
    out.parent.mkdir()
    code, _, err = run_cli(["fmt", src, "-o", str(out)])
    assert code == 2 and err.startswith(f"{out}: cannot write: No space left on device")
    assert list(out.parent.iterdir()) == []


# 7 ------------------------------------------------------------------------ signals
CHILD = textwrap.dedent("""
    import signal, sys, time
    from paramsurgery.core.fs import atomic_open
    # a signal the parent ignores (nohup, some job runners: SIGHUP) stays ignored on purpose;
    # the test is about the default disposition
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    with atomic_open(sys.argv[1]) as fh:
        fh.write(b"x" * 1000)
        print("ready", flush=True)
        time.sleep(60)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signals_remove_the_temporary_file(tmp_path, sig):
    out = tmp_path / "o.bin"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO)
    assert proc.stdout.readline().strip() == b"ready"
    assert len(list(tmp_path.iterdir())) == 1  # the hidden temporary
    proc.send_signal(sig)
    proc.wait(timeout=30)
    assert list(tmp_path.iterdir()) == []


def test_cli_exits_128_plus_signal(monkeypatch, capsys):
    from paramsurgery.commands import info

    def killed(args):
        raise Terminated(signal.SIGTERM)

    monkeypatch.setattr(info, "run", killed)
    assert main(["info", "x.param"]) == 128 + signal.SIGTERM
    assert "terminated" in capsys.readouterr().err


# 8 ------------------------------------------------------------------------ synth-bin
def test_synth_bin_refuses_to_overwrite_without_force(tmp_path):
    p = write(tmp_path, b"7767517\n2 2\nInput in 0 1 a\nInnerProduct fc 1 1 a b 0=4 1=1 2=16\n")
    b = tmp_path / "m.bin"
    b.write_bytes(b"real weights")
    code, _, err = run_cli(["synth-bin", p, "-o", str(b)])
    assert code == 2 and err.startswith(f"{b}: exists") and "--force" in err
    assert b.read_bytes() == b"real weights"
    assert run_cli(["synth-bin", p, "-o", str(b), "--force"])[0] == 0
    assert b.stat().st_size == 4 + 16 * 4 + 4 * 4


# 9 ------------------------------------------------------------------------ side files
@pytest.mark.parametrize("content", [b"", b"garbage", b"PK\x03\x04broken"])
def test_bad_reference_next_to_the_model_is_a_finding(tmp_path, content):
    p = write(tmp_path, SIMPLE, "X.ncnn.param")
    (tmp_path / "X.ref.npz").write_bytes(content)
    code, out, err = run_cli(["lint", p], timeout=60)
    assert code == 0, err
    assert "PS400 warning reference not used:" in out and "X.ref.npz" in out


def test_reading_a_device_is_bounded():
    t = time.perf_counter()
    code, _, err = run_cli(["info", "/dev/zero"], timeout=60)
    assert code == 2 and err.startswith("/dev/zero: not a regular file and longer than")
    assert time.perf_counter() - t < 30


def test_huge_integers_in_pnnx_side_file(tmp_path):
    p = write(tmp_path, SIMPLE, "X.ncnn.param")
    (tmp_path / "X.pnnx.param").write_bytes(
        b"7767517\n2 2\npnnx.Input in 0 1 a #a=(1," + b"9" * 5000 + b")f32\n"
        b"nn.ReLU r 1 1 a b #a=(1,4)f32 #b=(1,4)f32 k=" + b"9" * 5000 + b"\n")
    code, _, err = run_cli(["lint", "--no-run", p], timeout=60)
    assert code in (0, 1, 2), err
    assert code != 2 or err.startswith(str(tmp_path)), err


def test_layer_with_too_few_bottoms_is_no_internal_error(tmp_path):
    """Found by the slow fuzz: a Split with no bottom crashed the shape analysis (exit 3)."""
    data = (b"7767517\n4 4\nInput in0 0 1 in0\nSplit spl1 0 1 in1\nSigmoid s 1 1 in1 a\n"
            b"ReLU r 1 1 a out0\n")
    p = write(tmp_path, data)
    code, out, err = run_cli(["lint", "--no-run", p], timeout=60)
    assert code == 0, err  # ncnn loads it too
    assert load_verdicts([data])[0].loads


# the loader child ---------------------------------------------------------------------
def test_loader_child_pins_crashes_and_hangs_to_their_file(monkeypatch):
    """One long-lived child answers every load; a file that kills it or hangs it gets its
    own verdict and the next file goes to a fresh child."""
    from paramsurgery.runtime import loader as ncnn_loader

    fake = ncnn_loader._CHILD.replace("import ncnn\n", "import signal, time\n").replace(
        "    net = ncnn.Net()\n    rc = ",
        "    if data == b'crash':\n        os.write(2, b'dying')\n        os.kill(os.getpid(), "
        "signal.SIGSEGV)\n    if data == b'hang':\n        time.sleep(60)\n    rc = 0 if "
        "data.startswith(b'ok') else -1 #")
    fake = fake.replace("    del net\n", "    os.write(2, b'said ' + data) if rc else None\n")
    monkeypatch.setattr(ncnn_loader, "_CHILD", fake)
    monkeypatch.setattr(ncnn_loader, "available", lambda: True)
    loader = ncnn_loader._Loader()
    monkeypatch.setattr(ncnn_loader, "_LOADER", loader)
    files = [b"ok1", b"bad", b"crash", b"ok2", b"hang", b"ok3"]
    got = ncnn_loader.load_verdicts(files, timeout=1)
    assert [v.status for v in got] == ["ok", "rejected", "crashed", "ok", "hung", "ok"]
    assert got[1].messages == ("said bad",) and got[2].messages == ("dying",)
    assert got[2].code == -signal.SIGSEGV
    pid = loader.proc.pid
    assert ncnn_loader.load_verdicts([b"ok4"])[0].loads and loader.proc.pid == pid  # reused
    loader.close()


@pytest.mark.parametrize("out_name", ["o.param", "o.param.bin"])
def test_fmt_of_a_graph_without_blobs_keeps_a_loadable_header(tmp_path, out_name):
    """Found by the .param.bin fuzz: a layer with no bottoms and no tops counts no blob, and
    ncnn refuses a header blob_count of 0 (it loads the input, whose header says 1)."""
    data = b"7767517\n1 1\nInput in 0 0\n"
    src = write(tmp_path, data)
    out = tmp_path / out_name
    code, _, err = run_cli(["fmt", src, "-o", str(out)])
    assert code == 0, err
    assert out.read_bytes().startswith(b"\xdd\x85\x76\x00" if out_name.endswith(".bin")
                                       else b"7767517\n1 1\n")
    ins, outs = load_verdicts([data, out.read_bytes()])
    assert ins.loads and outs.loads, outs.message


def test_commands_write_param_bin_outputs_in_binary(tmp_path):
    """A `.param.bin` output (and `--in-place` on one) stays binary: ncnn's load_param_bin
    reads it."""
    from paramsurgery.formats.param_bin import write_param_bin

    src = tmp_path / "m.param.bin"
    src.write_bytes(write_param_bin(paramsurgery.loads(SIMPLE)))
    for argv in (["fmt", str(src), "-o", str(tmp_path / "a.param.bin")],
                 ["fix", str(src), "-o", str(tmp_path / "b.param.bin"), "--always-write"],
                 ["remove-passthrough", str(src), "-o", str(tmp_path / "c.param.bin")],
                 ["fmt", str(src), "--in-place"]):
        code, _, err = run_cli(argv)
        assert code == 0, (argv, err)
    outs = [tmp_path / n for n in ("a.param.bin", "b.param.bin", "c.param.bin", "m.param.bin")]
    assert all(o.read_bytes()[:4] == b"\xdd\x85\x76\x00" for o in outs)
    assert all(v.loads for v in load_verdicts([o.read_bytes() for o in outs]))


def test_a_refused_rewrite_is_located(tmp_path):
    """Found by the 100k fuzz: removing a Split that reads a dangling blob would leave its
    reader dangling; the refusal starts with `file:line:` like every exit-2 message."""
    src = write(tmp_path, b"7767517\n3 4\nInput in0 0 1 in0\nSplit s 1 1 x y\nReLU r 1 1 y z\n")
    assert load_verdicts([open(src, "rb").read()])[0].loads
    code, _, err = run_cli(["remove-passthrough", src, "-o", str(tmp_path / "o.param")])
    assert code == 2 and err.startswith(f"{src}:5: remove-passthrough would leave the graph "
                                        f"invalid"), err
    assert not (tmp_path / "o.param").exists()


def test_a_pass_that_cannot_prove_a_layer_refuses_on_its_line(tmp_path):
    """`<pass> cannot prove the rewrite of ...` leads with the first unproven layer's line."""
    src = write(tmp_path, b"7767517\n3 4\nInput in0 0 1 in0\n"
                          b"Slice s 1 2 in0 a b -23300=2,1,-233 1=-233\nReLU r 1 1 a c\n")
    code, _, err = run_cli(["fix-slice", src, "-o", str(tmp_path / "o.param")])
    assert code == 2 and err.startswith(f"{src}:4: fix-slice cannot prove the rewrite"), err
    assert not (tmp_path / "o.param").exists()


def test_a_forked_copy_leaves_the_parents_loader_child_alone():
    from paramsurgery.runtime import loader as ncnn_loader

    if not ncnn_loader.available():
        pytest.skip("ncnn not installed")
    assert ncnn_loader.load_verdicts([SIMPLE])[0].loads
    parent_child, scratch = ncnn_loader._LOADER.proc.pid, ncnn_loader._LOADER.tmp
    pid = os.fork()
    if pid == 0:  # the copy: its own loader child, and closing it touches nothing of ours
        ok = ncnn_loader.load_verdicts([SIMPLE])[0].loads
        ncnn_loader._LOADER.close()
        os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert os.path.isdir(scratch) and ncnn_loader._LOADER.proc.pid == parent_child
    assert ncnn_loader.load_verdicts([SIMPLE])[0].loads
