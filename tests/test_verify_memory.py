"""Memory of verification (issue 15): the weights of a net run for a check are resident once.

ncnn layers that repack their weights (Gemm, Convolution, ...) free the originals only when
the net is loaded in light mode; a net loaded with light mode off (what extracting
intermediate blobs seemed to need) held its weights twice. `load_net` and compare's child
load in light mode and then apply the asked mode to the extractors; the streaming check
keeps one of its two nets (start graph, steady graph) at a time."""

from __future__ import annotations

import numpy as np
import pytest

ncnn = pytest.importorskip("ncnn")

from paramsurgery.runtime.child import RunOptions, load_net, run_net  # noqa: E402
from paramsurgery.formats.io import save  # noqa: E402

CHAIN = ("7767517\n4 4\nInput in0 0 1 in0\nGemm g0 1 1 in0 h0 10=-1 2=0 3=1 4=0 5=1 6=1 7=0 "
         "8=8 9=8\nReLU r 1 1 h0 h1\nGemm g1 1 1 h1 out0 10=-1 2=0 3=1 4=0 5=1 6=1 7=0 8=8 "
         "9=8\n")


def test_nets_load_their_weights_in_light_mode_and_extract_intermediates(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    param = tmp_path / "g.param"
    param.write_text(CHAIN)
    seen = []
    real = ncnn.Net

    class Recording(real):  # type: ignore[misc, valid-type]
        def load_model(self, *args):  # noqa: ANN002, ANN202
            seen.append(self.opt.lightmode)
            return super().load_model(*args)

    monkeypatch.setattr(ncnn, "Net", Recording)
    net = load_net(str(param), None, RunOptions(light_mode=False))
    assert seen == [True]  # weights: loaded in light mode (originals freed once repacked)
    assert net.opt.lightmode is False  # extractors keep the intermediate blobs as asked
    x = np.ones((2, 8), np.float32)
    out = run_net(net, {"in0": x}, ["h0", "h1", "out0"])
    assert out["h0"].shape == (2, 8) and out["out0"].shape == (2, 8)


def test_stream_check_holds_one_net_at_a_time(tmp_path) -> None:
    from paramsurgery.streaming import StreamingRunner, convert

    from conftest import FIXTURES

    p, b = (str(FIXTURES / "streaming" / f"worked_example.ncnn.{ext}") for ext in ("param", "bin"))
    conv = convert(p, b, str(tmp_path / "w"))
    assert conv.start_param is not None  # the case has a start graph and a steady one
    both = StreamingRunner(conv.param, conv.bin, conv.manifest_path)
    one = StreamingRunner(conv.param, conv.bin, conv.manifest_path, one_net=True)
    assert len(both._nets) == 2 and len(one._nets) == 0
    rng = np.random.default_rng(0)
    frames = rng.standard_normal((1, 9)).astype(np.float32)
    for r in (both, one):
        got = []
        for a, c in ((0, 2), (2, 5), (5, 9)):
            got.append(r.push(frames[:, a:c]))
            if r is one:
                assert len(one._nets) <= 1
        r.outs = np.concatenate(got, axis=1)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(both.outs, one.outs)  # type: ignore[attr-defined]
    one.flush()
    one.push(frames[:, :2])  # a new stream starts with the start graph again
    assert list(one._nets) == ["start"]


def _rss() -> int:
    import os

    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/statm"), reason="Linux /proc")
def test_hashing_weights_leaves_the_file_out_of_the_process(tmp_path) -> None:
    """`reduce` checks the written weights against the source by content hash: a pass over
    two multi-GB files, which kept both mapped in (2x the weight bytes, the reduce peak)."""
    import paramsurgery
    from paramsurgery.formats.weights.synth import write_synth_bin

    rows = ["Input in0 0 1 in0"] + [
        f"Gemm g{i} 1 1 {'in0' if i == 0 else f'h{i - 1}'} h{i} 10=-1 2=0 3=1 4=0 5=1 6=1 7=0 "
        f"8=1024 9=1024" for i in range(8)]
    param = tmp_path / "g.param"
    param.write_text("7767517\n9 9\n" + "\n".join(rows) + "\n")
    with open(tmp_path / "g.bin", "wb") as fh:
        write_synth_bin(paramsurgery.load(param), fh)
    g = paramsurgery.load(param, bin=tmp_path / "g.bin")
    size = (tmp_path / "g.bin").stat().st_size
    assert size > 32 << 20
    before = _rss()
    hashes = {layer.name: layer.weights.sha256 for layer in g if layer.type == "Gemm"}
    assert len(hashes) == 8 and len(set(hashes.values())) == 8
    assert _rss() - before < size // 4, (before, _rss(), size)


def _mapped_bytes(path) -> int:
    """Resident bytes of this process's mappings of `path` (/proc/self/smaps)."""
    total, current = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                current = line.rstrip("\n").endswith(str(path))
            elif current and line.startswith("Rss:"):
                total += int(head[1]) * 1024
    return total


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="Linux /proc")
def test_loading_weights_reads_the_tags_without_mapping_the_file_in(tmp_path) -> None:
    """The loader reads each weight's 4-byte tag; through the mapping, each read mapped a
    large folio around it (409 MB of the real talker's 1.76 GB resident in every command
    that loads it: the parent of each --verify)."""
    import paramsurgery
    from paramsurgery.formats.weights.synth import write_synth_bin

    rows = ["Input in0 0 1 in0"] + [
        f"Gemm g{i} 1 1 {'in0' if i == 0 else f'h{i - 1}'} h{i} 10=-1 2=0 3=1 4=0 5=1 6=1 7=0 "
        f"8=512 9=512" for i in range(16)]
    param = tmp_path / "g.param"
    param.write_text("7767517\n17 17\n" + "\n".join(rows) + "\n")
    bin_path = tmp_path / "g.bin"
    with open(bin_path, "wb") as fh:
        write_synth_bin(paramsurgery.load(param), fh)
    g = paramsurgery.load(param, bin=bin_path)
    assert sum(1 for layer in g if layer.weights) == 16
    assert _mapped_bytes(bin_path) < 64 * 1024, _mapped_bytes(bin_path)


def test_extract_check_runs_each_graph_in_a_child(tmp_path, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
    """extract --verify loaded the full graph and the subgraph in this process at once
    (1.58x the weights of the real talker cut in half): each now runs in a child, one after
    the other; no net is loaded here."""
    import paramsurgery
    import paramsurgery.runtime.child as runtime
    from paramsurgery.passes.extract import check_extract, extract_subgraph

    param = tmp_path / "g.param"
    param.write_text(CHAIN)
    g = paramsurgery.load(param)
    save(extract_subgraph(g, ["h0"], ["out0"]), tmp_path / "head.param")

    def no_net_here(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("a net was loaded in the verifying process")

    monkeypatch.setattr(runtime, "load_net", no_net_here)
    monkeypatch.setattr(ncnn, "Net", no_net_here)
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    check = check_extract(str(param), None, str(tmp_path / "head.param"), None, {"in0": x},
                          ["out0"], cut=["h0"])
    assert check.exact and check.shapes == {"out0": (2, 8)}, check.format()


def test_size_checked_pool_gives_a_plain_nets_numbers(tmp_path) -> None:
    """ncnn's own pool hands a freed large block to a small request (99 MB of activations
    instead of 65 on the real codec conv stack at 12 frames): `RunOptions(pool=True)` nets
    allocate blobs from a size-checked pool of their own, freed after each run, with the
    numbers of a plain net; the streaming runner's nets use it."""
    param = tmp_path / "g.param"
    param.write_text(CHAIN)
    pooled = load_net(str(param), None, RunOptions(pool=True))
    plain = load_net(str(param), None, RunOptions())
    assert len(pooled.pools) == 1 and not hasattr(plain, "pools")
    rng = np.random.default_rng(0)
    for rows in (3, 200, 7):
        x = rng.standard_normal((rows, 8)).astype(np.float32)
        a = run_net(pooled, {"in0": x}, ["out0"])["out0"]
        np.testing.assert_array_equal(a, run_net(plain, {"in0": x}, ["out0"])["out0"])
    from paramsurgery.streaming import StreamingRunner, convert

    from conftest import FIXTURES

    p, b = (str(FIXTURES / "streaming" / f"worked_example.ncnn.{ext}") for ext in ("param", "bin"))
    conv = convert(p, b, str(tmp_path / "w"))
    runner = StreamingRunner(conv.param, conv.bin, conv.manifest_path)
    assert all(hasattr(net, "pools") for net in runner._nets.values())


def test_running_ncnn_in_a_child_leaves_the_ir_unimported() -> None:
    """`python -m paramsurgery.runtime.child` (every isolated run) imports the package: with the IR
    imported eagerly that was ~20 MB more next to the weights the child holds."""
    import subprocess
    import sys

    from paramsurgery.runtime.launch import child_env

    code = ("import sys, paramsurgery.runtime.child\n"
            "heavy = [m for m in ('networkx', 'paramsurgery.ir.graph', 'paramsurgery.ir.params') "
            "if m in sys.modules]\n"
            "assert not heavy, heavy\n"
            "import paramsurgery\n"
            "assert paramsurgery.loads('7767517\\n1 1\\nInput in0 0 1 in0\\n').inputs == "
            "['in0']\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=child_env())
    assert r.returncode == 0, r.stderr
