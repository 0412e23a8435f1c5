"""`compare --pnnx` on what the zoo exposed (issue 24, item 4): an error inside
paramsurgery is never blamed on pnnx, empty tensors go through the recorder, and ncnn
feeds without pnnx's batch axis (`--inputshape`) get it back for the torch side."""

from __future__ import annotations

import io
import os

import numpy as np

from paramsurgery.formats.pnnx_param import Operand
from paramsurgery.runtime.child import Feed
from paramsurgery.verify.compare.against_torch import torch_feed
from paramsurgery.verify.compare.frames import FrameFile, read_frames, write_frame
from paramsurgery.verify.compare.torch_run import blame

import paramsurgery.verify.compare.torch_child as torch_child

PKG_FILE = torch_child.__file__


def _traceback(*files: str, last: str = "RuntimeError: boom") -> str:
    lines = ["Traceback (most recent call last):"]
    for f in files:
        lines += [f'  File "{f}", line 3, in f', "    x = 1"]
    return "\n".join(lines + [last]) + "\n"


def test_a_failure_inside_the_recorder_is_ours_not_pnnx(tmp_path) -> None:
    script = str(tmp_path / "m_pnnx.py")
    # innermost frame in paramsurgery (the recorder), called from pnnx's forward
    assert blame(_traceback(PKG_FILE, script, PKG_FILE), script) == "internal"
    # innermost frame in pnnx's script, or in torch called from it: pnnx's export
    assert blame(_traceback(PKG_FILE, script), script) == "pnnx"
    assert blame(_traceback(PKG_FILE, script, "/usr/lib/torch/nn/functional.py"), script) == "pnnx"
    assert blame("Segmentation fault", script) == "error"
    assert blame(_traceback(PKG_FILE, last="ModuleNotFoundError: No module named 'torch'"),
                 script) == "missing_torch"


def test_empty_tensors_go_through_the_frame_stream(tmp_path) -> None:
    empty = np.zeros((1, 0, 4), np.float32)
    full = np.arange(6, dtype=np.int64).reshape(2, 3)
    buf = io.BytesIO()
    write_frame(buf, {"name": "v_empty"}, empty)
    write_frame(buf, {"name": "v_full"}, full)
    write_frame(buf, {"end": True})
    frames = list(read_frames(io.BytesIO(buf.getvalue())))
    assert frames[0][1].shape == (1, 0, 4) and np.array_equal(frames[1][1], full)
    path = tmp_path / "frames"
    path.write_bytes(buf.getvalue())
    with FrameFile(path) as ff:
        assert ff.get("v_empty").shape == (1, 0, 4)
        assert np.array_equal(ff.get("v_full"), full)
    # an empty tensor last in the file (offset == file size)
    tail = io.BytesIO()
    write_frame(tail, {"name": "v_last"}, empty)
    path.write_bytes(tail.getvalue())
    with FrameFile(path) as ff:
        assert ff.get("v_last").shape == (1, 0, 4)
    assert os.path.getsize(path) == len(tail.getvalue())


def test_the_torch_side_gets_pnnx_batch_axis_back() -> None:
    arr = np.ones((11, 32), np.float32)               # --inputshape in0=[11,32]
    op = Operand("0", (1, 7, 32), "f32")                # traced (1, 7, 32)
    assert torch_feed(Feed(arr), op, 0).array.shape == (1, 11, 32)
    assert torch_feed(Feed(arr), op, None).array.shape == (1, 11, 32)   # first size-1 axis
    op2 = Operand("0", (7, 1, 32), "f32")
    assert torch_feed(Feed(arr), op2, 1).array.shape == (11, 1, 32)
    same = Feed(np.ones((1, 11, 32), np.float32), 0)    # already at the traced rank
    assert torch_feed(same, op, 0) is same


def test_ncnn_pow_of_a_negative_base_is_wrong() -> None:
    """What README "Model zoo" says of GPT-2's gelu_new: pnnx writes `x ** 3.0` as
    `BinaryOp 0=6 2=3.0`, and ncnn's pow is wrong for a negative base (exp(b * log a))."""
    import pytest

    pytest.importorskip("ncnn")
    from paramsurgery.runtime.child import run_isolated

    param = "7767517\n2 2\nInput in0 0 1 in0\nBinaryOp p 1 1 in0 out0 0=6 1=1 2=3.0\n"
    x = np.array([[-2.0, -0.5, 0.5, 2.0]] * 4, np.float32)
    res = run_isolated(param, None, {"in0": x}, ["out0"])
    assert res.ok, res.describe()
    got = res.outputs["out0"][0]
    assert np.allclose(got[2:], [0.125, 8.0])
    assert not np.allclose(got[:2], [-8.0, -0.125])   # torch: -8, -0.125
