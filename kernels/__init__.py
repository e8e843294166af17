"""Hand-written NKI 0.6 kernels, installed as `neuron_dynamo.kernels`.

The kernel modules say `import nki`, `import nki.language as nl`, `import nki.isa as nisa`, exactly as
they would on a Trainium host, so that they compile unchanged with the real toolchain. Where the genuine
`nki` package is absent, importing this package makes those names resolve to the project's CPU
interpreter (`neuron_dynamo.nki`).
"""

from neuron_dynamo.nki import make_importable as _make_nki_importable

_make_nki_importable()
