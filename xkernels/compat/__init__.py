"""Entry points with other libraries' signatures over the xkernels kernels.

`xkernels.compat.flashinfer` mirrors FlashInfer's chain sampling API and `xkernels.compat.sglang`
SGLang's tree verification API, where our ops cover them; each function documents where it differs.
"""

from . import flashinfer, sglang

__all__ = ["flashinfer", "sglang"]
