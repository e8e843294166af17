"""Region lowering for the NKI targets: library-kernel patterns first, then generated code for the rest.

`patterns.rewrite` replaces the op chains one library kernel computes better (RMSNorm, SwiGLU, RoPE, attention,
cross-entropy); `generated.lower_graph` fuses the element-wise chains left into generated kernels and calls each
other op's kernel. The layers read one way: registry and codegen → generated → op families → patterns → here.
"""

from __future__ import annotations

import torch.fx as fx

from neuron_dynamo.lowering import patterns
from neuron_dynamo.lowering.generated import lower_graph


def lower_region_nki(region: fx.GraphModule, target: str) -> fx.GraphModule:
    """The region as a graph of NKI kernel calls: library-kernel patterns, fused groups and per-op kernels."""
    matched = fx.Graph()
    matched.output(matched.graph_copy(region.graph, val_map={}))
    region = fx.GraphModule(region, matched)
    patterns.rewrite(region)
    return lower_graph(region, target)
