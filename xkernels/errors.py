"""The asynchronous error flag of the sampling ops: what each bit of a request's word means.

An engine passes an int32 ``[N]`` tensor as ``errors`` (:func:`xkernels.chain_verify_ragged_`,
:func:`xkernels.chain_verify`, :func:`xkernels.tree_verify`, :func:`xkernels.dllm_step`, the Spiffy
ops, the refine ops, :func:`xkernels.shard_row_stats` and the functions of
:mod:`xkernels.distributed` with per-request parameters); the op ORs each request's bits into its
word on the device, with no host sync, and the engine reads the words when it already syncs (with
the emitted tokens). The values a bit names are read as off, as the kernels read them without the
flag: the flag reports them, it changes no result.
csrc/include/xkernels/param_errors.h computes the same bits in the kernels.
"""

import enum


class SamplingError(enum.IntFlag):
    """The bits of a request's error word: ``SamplingError(word)`` names the invalid values."""

    TEMPERATURE = 1  #: NaN, infinite or negative; read as greedy (0)
    TOP_K = 2  #: negative; read as off (0)
    TOP_P = 4  #: NaN or outside (0, 1]; read as off (1)
    MIN_P = 8  #: NaN or outside [0, 1]; read as off (0)
