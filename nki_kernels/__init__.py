"""Hand-written NKI 0.6 kernels, installed as `neuron_dynamo.kernels`.

The kernel modules say `import nki`, `import nki.language as nl`, `import nki.isa as nisa`, exactly as
they would on a Trainium host, so that they compile unchanged with the real toolchain. Where the genuine
`nki` package is absent, importing this package makes those names resolve to the project's CPU
interpreter (`neuron_dynamo.nki`).

One module per kernel family; each module docstring states the layout contract and the tiling idea:
`matmul` (matmul_kernel), `transpose` (transpose_kernel), `softmax` (softmax_kernel, log_softmax_kernel),
`norms` (rmsnorm_kernel, rmsnorm_saved_kernel, rmsnorm_backward_kernel, layernorm_kernel),
`activations` (activation_kernel, gated_activation_kernel),
`rope` (rope_kernel, rope_backward_kernel), `attention` (attention_kernel: flash forward, GQA, causal/masked, decode),
`attention_bwd` (attention_backward_kernel), `cross_entropy` (cross_entropy_kernel,
cross_entropy_backward_kernel), `embedding` (embedding_kernel), `scatter` (scatter_add_kernel,
embedding_backward_kernel). Shared pieces: `tiling` (tile sizes,
transposed loads, partition broadcasts) and `contract` (KernelContractError for arguments outside a contract).
"""

from neuron_dynamo.nki import make_importable as _make_nki_importable

_make_nki_importable()
