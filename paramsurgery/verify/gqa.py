"""fold-gqa's proof: the folded decoder against a reference graph (the unfolded one when ncnn
can load it, else a twin such as the ported export), through ncnn, at several lengths."""

from __future__ import annotations

from dataclasses import dataclass, field

from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph


@dataclass
class FoldCheck:
    """The folded decoder against a reference graph (the unfolded one when ncnn can load it,
    else a twin), through ncnn, at several lengths."""

    reference: str
    lengths: list[int]
    rel: dict[int, float] = field(default_factory=dict)
    tol: float = 1e-5
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.rel) and all(v <= self.tol
                                                             for v in self.rel.values())

    def format(self) -> str:
        from paramsurgery.verify.equivalence import format_parity

        return format_parity(f"fold-gqa check: folded vs {self.reference} through ncnn (random "
                             f"embeds, causal mask, RoPE tables; tolerance rel {self.tol:g})",
                             self.error, [f"T={t:<5} max rel {v:.3e}  "
                                          f"{'ok' if v <= self.tol else 'MISMATCH'}"
                                          for t, v in self.rel.items()], self.ok)


def decoder_feeds(g: Graph, io, length: int, seed: int) -> dict:
    """Random decoder inputs of `length` positions in the fixtures' convention, plus empty
    caches for every cache input of a kv-cache graph."""
    import numpy as np

    from paramsurgery.verify.kvcache import causal_mask, infer_head_dim, infer_hidden, rope_tables
    from paramsurgery.passes.kvcache import cache_slots

    hidden = io.hidden or infer_hidden(g, io.embeds)
    if not hidden:
        raise PassRefused("cannot infer the hidden size of the decoder input; give --hidden")
    rng = np.random.default_rng(seed + length)
    feeds = {io.embeds: rng.standard_normal((length, hidden)).astype(np.float32),
             io.mask: causal_mask(length, 0)}
    if io.cos in g.inputs and io.sin in g.inputs:
        hd = io.head_dim or infer_head_dim(g)
        if not hd:
            raise PassRefused("cannot infer the RoPE head_dim; give --head-dim")
        cos, sin = rope_tables(np.arange(length), hd, io.rope_theta)
        feeds[io.cos], feeds[io.sin] = cos, sin
    for s in cache_slots(g):
        feeds[s.k_in] = np.zeros((0,), np.float32)
        feeds[s.v_in] = np.zeros((0,), np.float32)
    return feeds


def verify_fold(folded_param: str, bin: str, reference_param: str, *,
                lengths=(1, 9, 17), io=None, tol: float = 1e-5, seed: int = 0,
                reference_bin: str | None = None) -> FoldCheck:
    """Run the folded decoder and a reference (the unfolded graph, or a twin such as the
    ported export) on the same random decoder inputs at each length and compare the
    output. Both run in child processes (an unloadable reference is reported)."""
    from paramsurgery.formats.io import load
    from paramsurgery.verify.equivalence import run_side_by_side
    from paramsurgery.verify.kvcache import DecoderIO

    io = io or DecoderIO()
    check = FoldCheck(str(reference_param), list(lengths), tol=tol)
    gf, gr = load(folded_param), load(reference_param)
    for t in check.lengths:
        rel = run_side_by_side((folded_param, bin, decoder_feeds(gf, io, t, seed)),
                               (reference_param, reference_bin or bin,
                                decoder_feeds(gr, io, t, seed)),
                               [io.output], what="the folded graph")
        if isinstance(rel, str):
            check.error = f"T={t}: {rel}"
            return check
        check.rel[t] = rel[io.output]
    return check
