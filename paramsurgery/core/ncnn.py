"""Constants of ncnn's and pnnx's file conventions that several layers of the package read."""

from __future__ import annotations

# pnnx writes ncnn's batch axis (which ncnn drops) as the axis/dim value 233 (-233 in a
# param, `batch_index=233` in its test script): "no batch axis here"
NO_BATCH = 233
