"""Adapters that put the xkernels ops inside serving engines.

- :mod:`xkernels.integrations.ragged_verifier`: ``RaggedVerifier``, an engine's verify step over
  vLLM's flat layout, its buffers and streams built on the device (imports nothing from vLLM);
- :mod:`xkernels.integrations.vllm`: ``XKernelsRejectionSampler``, vLLM's V1 rejection sampler
  with ``chain_verify_ragged_`` doing the verification through ``RaggedVerifier`` (imports vLLM);
- :mod:`xkernels.integrations.vllm_plugin`: the ``vllm.general_plugins`` entry point that installs
  it when ``XKERNELS_VLLM=1`` (imports nothing from vLLM until vLLM loads it).
"""
