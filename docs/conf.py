"""Sphinx configuration of the xkernels docs (docs/build.sh builds them; docs/README.md says why Sphinx)."""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))  # xkernels itself comes from the environment (docs/build.sh)

project = "xkernels"
author = "the xkernels developers"
copyright = "2026, " + author
import xkernels  # noqa: E402  (the reference pages are generated from the built package)

release = xkernels.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.doctest", "myst_parser", "xk_apicheck"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "undoc-members": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_custom_sections = ["Kernels"]

# -n checks every cross-reference. There is no network for intersphinx, so the names of torch,
# typing and the standard library in signatures stay unlinked instead of warning.
nitpicky = True
nitpick_ignore_regex = [("py:class", r"(torch|typing|collections|pathlib|dataclasses)\..*"),
                        ("py:exc", r"torch\..*"),  # torch has no intersphinx inventory here
                        ("py:class", r"(Tensor|Path|optional|callable|NamedTuple)"),
                        ("py:class", r"\w+\[\w+")]  # a dataclass field's annotation, split at its commas

doctest_global_setup = "import torch\nimport xkernels"

html_theme = "alabaster"
html_static_path = []
html_theme_options = {"description": "C++/CUDA kernels for speculative decoding, as PyTorch ops"}
