"""Adapters that put the xkernels ops inside serving engines.

- :mod:`xkernels.integrations.vllm`: ``XKernelsRejectionSampler``, vLLM's V1 rejection sampler
  with ``chain_verify_ragged`` doing the verification (imports vLLM);
- :mod:`xkernels.integrations.vllm_plugin`: the ``vllm.general_plugins`` entry point that installs
  it when ``XKERNELS_VLLM=1`` (imports nothing from vLLM until vLLM loads it).
"""
