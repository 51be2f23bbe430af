"""The vLLM plugin: entry point ``xkernels`` of the group ``vllm.general_plugins`` (pyproject.toml).

vLLM calls :func:`register` in each of its processes before a worker builds its model runner.
With ``XKERNELS_VLLM=1`` it arranges for the V1 model runner module, when it is imported, to build
:class:`xkernels.integrations.vllm.XKernelsRejectionSampler`, and, where that sampler's op has a
kernel for the platform's device, for vLLM to accept ``min_p`` and ``logit_bias`` under
speculative decoding (which vLLM refuses because its own rejection sampler cannot honour them).
It also lets that runner run the xPress proposer (:mod:`xkernels.integrations.vllm_xpress`).
Otherwise it does nothing. It imports nothing from vLLM's model runner itself, so that the
processes that never build one (the front end) stay as they are.
"""

import importlib.abc
import importlib.util
import os
import sys

from .ragged_verifier import has_kernel

# vLLM releases whose RejectionSampler.__init__/forward, SamplingMetadata and
# GPUModelRunner._sample this plugin was written against and tested with.
KNOWN_VLLM_VERSIONS = ("0.32.0",)
V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
V2_RUNNER = "vllm.v1.worker.gpu.model_runner"


def known_version(version: str) -> bool:
    """Whether vLLM ``version`` (a local suffix such as ``+cpu`` aside) is one this plugin knows.

    Args:
        version: ``vllm.__version__``.

    Returns:
        bool.
    """
    return version.split("+")[0] in KNOWN_VLLM_VERSIONS


def register() -> None:
    """vLLM's general-plugin hook: installs the xkernels sampler when ``XKERNELS_VLLM=1``.

    An unknown vLLM version is refused with an error in vLLM's log, and vLLM's sampler kept.
    """
    if os.environ.get("XKERNELS_VLLM") != "1":
        return
    import vllm
    from vllm.logger import init_logger

    logger = init_logger("vllm.xkernels")
    if not known_version(vllm.__version__):
        logger.error("xkernels: XKERNELS_VLLM=1, but vLLM %s is not a version whose rejection sampler xkernels "
                     "knows (known: %s); vLLM's own RejectionSampler stays", vllm.__version__,
                     ", ".join(KNOWN_VLLM_VERSIONS))
        return
    _when_imported(V1_RUNNER, _install_v1, logger)
    _when_imported(V2_RUNNER, _warn_v2, logger)
    _when_imported("vllm.sampling_params", _accept_min_p_and_bias, logger)
    logger.info("xkernels: XKERNELS_VLLM=1: the V1 model runner will verify with xkernels")


def _install_v1(module, logger):
    from . import vllm_xpress
    from .vllm import install

    install(module)
    vllm_xpress.install(module)
    logger.info("xkernels: %s.RejectionSampler is now XKernelsRejectionSampler (and the runner can run "
                "xkernels.integrations.vllm_xpress.XPressProposer)", module.__name__)


def _warn_v2(module, logger):
    init = module.GPUModelRunner.__init__

    def warn_then_init(self, *args, **kwargs):
        logger.warning("xkernels: model runner V2 has a rejection sampler of its own, which XKERNELS_VLLM=1 does "
                       "not replace; set VLLM_USE_V2_MODEL_RUNNER=0 to verify with xkernels")
        init(self, *args, **kwargs)

    module.GPUModelRunner.__init__ = warn_then_init


def _accept_min_p_and_bias(module, logger):
    """Lifts SamplingParams' refusal of min_p and logit_bias under speculative decoding (its only
    check there in the known versions) where the V1 runner and a kernel are certain: the
    platform's device has one, and model runner V2 is neither asked for nor possible (it needs
    Triton). The runner keeps the two processors then (xkernels.integrations.vllm.install)."""
    import vllm.envs as envs
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    v2 = envs.VLLM_USE_V2_MODEL_RUNNER
    if not has_kernel(current_platform.device_type) or v2 or (v2 is None and HAS_TRITON):
        return

    def _validate_spec_decode(self, speculative_config):
        return None

    module.SamplingParams._validate_spec_decode = _validate_spec_decode
    logger.info("xkernels: min_p and logit_bias are accepted with speculative decoding")


def _when_imported(name, then, logger):
    """Runs ``then(module, logger)`` on module ``name`` now if it is imported, else right after its import.
    A failure is logged and leaves the module as vLLM wrote it."""

    def run(module):
        try:
            then(module, logger)
        except Exception:
            logger.exception("xkernels: could not install into %s; vLLM's own sampler stays", name)

    if name in sys.modules:
        run(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, run))


class _AfterImport(importlib.abc.MetaPathFinder):
    """A finder that lets the usual finders find one module and wraps its loader so that a
    callback sees the module once it has executed."""

    def __init__(self, name, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_call(module):
            exec_module(module)
            self.callback(module)

        spec.loader.exec_module = exec_then_call
        return spec
