"""Fails the docs build (a warning, an error under -W) when the public API and its reference pages
disagree: every public object must have a reference entry and a docstring, and every op in
xkernels.__all__ must document each of its arguments (an Args section naming them), what it
returns and, for the kernels' entry points in xkernels.ops, what raises and how each device
computes it (Raises and Kernels sections). autodoc itself renders an object without a docstring
silently, and napoleon does not compare Args with the signature."""

import importlib
import inspect
import re

# Public modules besides the package itself: their __all__, or else every function and class they
# define whose name does not start with an underscore.
MODULES = ("xkernels.distributed", "xkernels.decoding", "xkernels.decoding.spiffy_calibration", "xkernels.spiffy",
           "xkernels.tree", "xkernels.compat.flashinfer", "xkernels.compat.sglang", "xkernels.errors")
SECTION = re.compile(r"^(\w[\w ]*):\s*$")


def public_objects():
    """(qualified name, object, strict): strict for the ops of xkernels.__all__."""
    import xkernels

    found = [(f"xkernels.{name}", getattr(xkernels, name), True) for name in xkernels.__all__]
    for modname in MODULES:
        module = importlib.import_module(modname)
        names = getattr(module, "__all__", None)
        if names is None:
            names = [n for n, obj in vars(module).items() if not n.startswith("_")
                     and (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == modname]
        found += [(f"{modname}.{name}", getattr(module, name), False) for name in names]
    # Constants (decoding.MODES) are described in their module's text; autodoc lists only what
    # carries a docstring.
    return [(name, obj, strict) for name, obj, strict in found if inspect.isfunction(obj) or inspect.isclass(obj)]


def sections(doc):
    """{section title: its lines} of a Google-style docstring ("" holds the text before the first)."""
    out, title = {"": []}, ""
    for line in doc.splitlines():
        match = SECTION.match(line)
        if match and not line.startswith(" "):
            title = match.group(1)
            out[title] = []
        else:
            out[title].append(line)
    return out


def documented_args(lines):
    """The names an Args section documents: the first words of its entries ("a, b: ..." names two)."""
    names = set()
    for line in lines:
        match = re.match(r"^ {4}(\*{0,2}\w+(?:, \*{0,2}\w+)*)(?: \([^)]*\))?:", line)
        if match:
            names |= {n.lstrip("*") for n in match.group(1).split(", ")}
    return names


def problems(name, obj, strict):
    doc = inspect.getdoc(obj)
    if not doc:
        return [f"{name} has no docstring"]
    if not strict or inspect.isclass(obj):
        return []
    found = sections(doc)
    out = []
    params = [p for p in inspect.signature(obj).parameters.values() if p.name != "self"]
    missing = [p.name for p in params if p.name not in documented_args(found.get("Args", []))]
    if missing:
        out.append(f"{name}: the Args section does not document {', '.join(missing)}")
    required = ["Returns"]
    if obj.__module__ == "xkernels.ops" and params:  # an op with arguments runs a kernel and checks them
        required += ["Raises", "Kernels"]
    out += [f"{name}: no {title} section" for title in required if title not in found]
    return out


def check(app, env):
    from sphinx.util import logging  # here, so that tests/test_docs_check.py needs no Sphinx

    logger = logging.getLogger(__name__)
    objects = env.get_domain("py").objects
    for name, obj, strict in public_objects():
        qualified = f"{obj.__module__}.{obj.__qualname__}" if hasattr(obj, "__qualname__") else name
        if name not in objects and qualified not in objects:
            logger.warning(f"{name} is public but no reference page documents it (docs/api)")
        for problem in problems(name, obj, strict):
            logger.warning(problem)


def setup(app):
    app.connect("env-check-consistency", check)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
