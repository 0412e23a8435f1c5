"""A Linear whose weight is a graph tensor, as pnnx 20261020 writes it for a tied lm_head
(`lm_head.weight is embed_tokens.weight`: GPT-2, Gemma, any `tie_word_embeddings=True`).

pnnx's IR keeps the right op, `nn.Linear lm_head 2 1 <table> <hidden> <logits>` with the
table as its first operand; its ncnn writer treats the first operand as the input and the
second as a bias:

    MemoryData    wte      0 1 w   0=C 1=V           # the tied table (V rows of C)
    InnerProduct  linear   1 1 w p 0=V 1=0 2=V*C     # the table times its own copy: (V, V)
    BinaryOp      bias     2 1 p h out 0=0           # + the hidden states: (V, V), not (T, V)

The graph computes `W·Wᵀ + h` instead of `h·Wᵀ` (lint PS401/PS403 at the traced shapes).
Detection is the rule below (the `.param` format of `paramsurgery rewrite`), shared by lint
(PS017) and `fix-tied-linear`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.patterns.pattern import find_matches
from paramsurgery.patterns.rule_file import RewriteRule, parse_rule

RULE = """\
# the tied table read as the input of an InnerProduct whose own weight has the table's size,
# then "biased" by the hidden states
pattern
MemoryData    table  0 1 w          *
InnerProduct  fc     1 1 w p        *
BinaryOp      add    2 1 p %x %y    0=0
replacement
InnerProduct  %fc    1 1 %x %y      %fc[*]
where
table[2] == 0 and table[11] == 0 and fc[0] == table[1] and fc[2] == table[0] * table[1]
fc[1] == 0 and fc[8] == 0 and fc[9] == 0
"""


@dataclass
class TiedLinear:
    table: Layer    # the MemoryData holding the tied weight (V rows of C)
    fc: Layer       # the InnerProduct reading it as its input
    add: Layer      # the BinaryOp adding the hidden states as if a bias
    hidden: str     # the blob the Linear should read
    out: str        # the blob it should write


@lru_cache(maxsize=1)
def rule() -> RewriteRule:
    return parse_rule(RULE, "tied_linear.rule")


def find_tied_linears(g: Graph) -> list[TiedLinear]:
    """Every tied Linear pnnx wrote as table-as-input + hidden-as-bias, in file order."""
    found, _miss = find_matches(g, rule())
    out = []
    for b in found:
        out.append(TiedLinear(b.layers["table"], b.layers["fc"], b.layers["add"],
                              b.blobs["%x"], b.blobs["%y"]))
    return out
