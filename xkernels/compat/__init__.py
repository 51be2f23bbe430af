"""Entry points with other libraries' signatures over the xkernels kernels.

`xkernels.compat.flashinfer` mirrors FlashInfer's sampling API where our ops cover it; each
function documents where it differs.
"""

from . import flashinfer

__all__ = ["flashinfer"]
