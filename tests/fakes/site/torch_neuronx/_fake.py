"""What the fake did, for tests to assert on: ``torch_neuronx._fake.record``.

Fields (plain lists of dicts/strings, appended in order; ``record.reset()`` empties them all):

- ``kernel_compiles``: one dict per eager NKI kernel compile, i.e. per new signature seen by a
  ``wrap_nki`` caller: ``{"kernel": name, "signature": (grid, tensor (shape, dtype) pairs and
  non-tensor values, in argument order)}``. Repeating a signature reuses the "compiled" kernel and
  records nothing, as the docs describe.
- ``nki_ops``: the names passed to ``nki_op`` (``"ns::name"``), one per registration.
- ``handoffs``: one dict per graph the ``torch.compile`` backend hands to the (absent) compiler:
  ``{"kind": "inference"|"forward"|"backward"|"per_shape", "targets": [str(node.target), ...],
  "input_shapes": [tuple or None, ...]}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Record:
    kernel_compiles: list = field(default_factory=list)
    nki_ops: list = field(default_factory=list)
    handoffs: list = field(default_factory=list)

    def reset(self) -> None:
        """Forget everything, including which kernel signatures count as already compiled."""
        self.kernel_compiles.clear()
        self.nki_ops.clear()
        self.handoffs.clear()
        from . import nki_hop

        nki_hop._compiled.clear()


record = Record()
