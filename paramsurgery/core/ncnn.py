"""Constants of ncnn's and pnnx's file conventions that several layers of the package read."""

from __future__ import annotations

from enum import IntEnum

# pnnx writes ncnn's batch axis (which ncnn drops) as the axis/dim value 233 (-233 in a
# param, `batch_index=233` in its test script): "no batch axis here"
NO_BATCH = 233
# ncnn Reshape / Crop leave a dim param at -233 when it is not given (src/layer/reshape.cpp)
UNSET_DIM = -233
# a Slice `-23300=` size of -233: "the rest", split evenly among such parts (src/layer/slice.cpp)
AUTO_SLICE = -233


class BinaryOpType(IntEnum):
    """BinaryOp `0=` (ncnn src/layer/binaryop.h). The r-forms swap the operands."""

    ADD = 0
    SUB = 1
    MUL = 2
    DIV = 3
    MAX = 4
    MIN = 5
    POW = 6
    RSUB = 7
    RDIV = 8
    RPOW = 9
    ATAN2 = 10
    RATAN2 = 11


class UnaryOpType(IntEnum):
    """UnaryOp `0=` (ncnn src/layer/unaryop.h)."""

    ABS = 0
    NEG = 1
    FLOOR = 2
    CEIL = 3
    SQUARE = 4
    SQRT = 5
    RSQRT = 6
    EXP = 7
    LOG = 8
    SIN = 9
    COS = 10
    TAN = 11
    ASIN = 12
    ACOS = 13
    ATAN = 14
    RECIPROCAL = 15
    TANH = 16
    LOG10 = 17
    ROUND = 18
    TRUNC = 19


class ReductionOpType(IntEnum):
    """Reduction `0=` (ncnn src/layer/reduction.h)."""

    SUM = 0
    ASUM = 1
    SUMSQ = 2
    MEAN = 3
    MAX = 4
    MIN = 5
    PROD = 6
    L1 = 7
    L2 = 8
    LogSum = 9  # ncnn's own spelling (ReductionOp_LogSum)
    LogSumExp = 10


class EltwiseOpType(IntEnum):
    """Eltwise `0=` (ncnn src/layer/eltwise.h)."""

    PROD = 0
    SUM = 1
    MAX = 2
