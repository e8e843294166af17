"""Views, reshapes and data movement: free on device when they only change the access pattern, DMA otherwise."""

import torch

from neuron_dynamo.lowering.registry import lowers

aten = torch.ops.aten


@lowers(
    aten.view, aten._unsafe_view, aten.reshape, aten.expand, aten.slice, aten.select, aten.narrow, aten.unsqueeze,
    aten.squeeze, aten.transpose, aten.split, aten.split_with_sizes, aten.unbind, aten.as_strided, aten.cat,
    aten.stack, aten.repeat, aten.constant_pad_nd, aten.slice_scatter, aten.select_scatter,
    aten.alias, aten.detach, aten.embedding, aten.index_select, aten.gather, aten.index,
    family="views",
)
def views(op, *args, **kwargs):
    """Reference kernel: torch moves the data; on device these become access patterns or (indirect) DMA."""
    return op(*args, **kwargs)
