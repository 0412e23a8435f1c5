"""`keep-precision`: keep chosen layers in full precision under ncnn's reduced-precision
options, through the per-layer feature mask `31=` (ncnn's
docs/developer-guide/layer-feat-mask.md; read in src/net.cpp for every layer type).

    Convolution conv1 1 1 conv0 conv1 0=128 1=3 6=36864 9=1
    DeepCopy    conv1_fp32_in0 1 1 conv0 conv0_conv1_fp32_in0             (--mode fp16)
    Convolution conv1 1 1 conv0_conv1_fp32_in0 conv1 0=128 1=3 31=3 6=36864 9=1

The bits are OR-ed into a `31=` already there (its other bits are kept): fp16 sets bit 0
(no fp16 arithmetic) and bit 1 (no fp16 storage), bf16 bit 2 (no bf16 storage).

The guard: ncnn 1.0.20261020 converts a 16-bit blob back to fp32 only for a layer whose
*own* (masked) options have fp16/bf16 storage on (`NetPrivate::convert_layout` in
src/net.cpp tests `opt.use_bf16_storage && !layer->support_bf16_storage` with the masked
option), so a masked layer fed by a reduced one reads bf16 bits as fp32: on a small CNN
under bf16 some placements hung ncnn or crashed it (SIGSEGV), others gave wrong numbers
silently (tests/test_precision.py). Every bottom of a masked layer whose producer is not
masked (and not an Input) therefore goes through a `DeepCopy` first: a layer without
fp16/bf16 storage on any architecture (a plain `clone()`), so ncnn casts the blob to fp32
in front of it, unmasked. No fp32 value changes (ncnn reads the bits only when the reduced
option is on; a DeepCopy copies). What the masks buy is measured by `paramsurgery
precision`, which writes its searched set with this pass.

int8 has no mask here: ncnn's bit 3 masks the int8 storage options of the Vulkan path, not
`use_int8_inference`, so a quantized CPU layer stays int8 whatever the bit
(`paramsurgery quantize --keep` leaves a layer in fp32 instead).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from paramsurgery.core.match import MatchFailure
from paramsurgery.core.changes import Change
from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.passes.base import Pass, PassResult
from paramsurgery.passes.options import option

if TYPE_CHECKING:
    from paramsurgery.ir.layer import Layer

FEATMASK = 31
GUARD = "DeepCopy"
# the bits that keep a layer in fp32 under each reduced-precision mode
MODE_BITS = {"fp16": 1 | 2, "bf16": 4}


def featmask(layer: "Layer") -> int:
    """The layer's `31=` (0 when absent or not an integer)."""
    value = layer.params.get(FEATMASK, 0)
    return value if isinstance(value, int) else 0


def mask_for(mode: str) -> int:
    try:
        return MODE_BITS[mode]
    except KeyError:
        raise PassRefused(f"no feature mask keeps a layer out of {mode!r} "
                          f"(modes: {', '.join(MODE_BITS)})") from None


class KeepPrecision(Pass, name="keep-precision", tag="keepprec",
                    summary="keep named layers in fp32 under fp16/bf16 options: the `31=` feature-mask "
                            "bits OR-ed in (what the masks buy: paramsurgery precision)"):
    # names (the command line) or layer ids (the precision search: pnnx writes some layer
    # names twice, e.g. two `splitncnn_0`)
    layers: tuple[str | int, ...] = option(default=(), flag="--layer", metavar="NAME", repeat=True,
                                           required=True,
                                           help="a layer to keep in full precision "
                                                "(repeatable)")
    mode: str = option(default="fp16", choices=tuple(sorted(MODE_BITS)),
                       help="the reduced precision to keep it out of (default fp16)")

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        mask_for(self.mode)  # an unknown mode is refused at once

    @property
    def bits(self) -> int:
        return mask_for(self.mode)

    def requires(self, g: Graph) -> None:
        unknown = [str(n) for n in self.layers if isinstance(n, str) and g.find(n) is None]
        if unknown:
            raise PassRefused(f"--layer names no layer of the graph: {', '.join(unknown)}")

    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        for ref in self.layers:
            layer = g.layer(ref)
            name = layer.name
            old = featmask(layer)
            new = old | self.bits
            if new == old:
                result.skipped.append(MatchFailure(name, f"31={old} already keeps it out of {self.mode}",
                                                   line=layer.source_line))
                continue
            layer.set(FEATMASK, new)
            result.changes.append(Change(name, f"kept out of {self.mode}",
                                         f"31={old}" if old else "no 31=", f"31={new}",
                                         layer.source_line))
            result.modified = True
        self._guard(g, result)
        return result

    def _guard(self, g: Graph, result: PassResult) -> None:
        """A DeepCopy in front of every bottom of a masked layer that an unmasked layer
        writes (see the module docstring)."""
        def masked(layer: "Layer") -> bool:
            return (featmask(layer) & self.bits) == self.bits

        for layer in [x for x in g if masked(x)]:
            for slot, blob in enumerate(layer.inputs):
                producer = g.producer(blob)
                if producer is None or producer.type == "Input" or masked(producer) or \
                        producer.type == GUARD:
                    continue
                name = g.unique_layer_name(f"{layer.name}_fp32_in{slot}")
                g.insert_before(layer, GUARD, name, slot=slot)
                result.changes.append(Change(name, f"fp32 guard in front of {layer.name} "
                                                   f"(bottom {slot}, written by {producer.name})",
                                             line=layer.source_line))
                result.modified = True
