"""`scipy.special` functions without the cost of importing `scipy.special`.

The package's `__init__` loads scipy's array-API layer, several times slower to import than the
compiled `scipy.special._ufuncs` that holds the one Beta quantile the simulator needs (figures:
docs/simulator.md, "Speed"). `betaincinv` loads that module alone when `scipy.special` is not
imported yet, and falls back to the public import if scipy's layout differs (a test checks that
the fast way is the one taken, and that a later `import scipy.special` still works).

It is not a wrapper around scipy: the functions returned are scipy's own ufuncs.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

_PACKAGE = "scipy.special"
_UFUNCS = "scipy.special._ufuncs"


def _load_ufuncs_alone() -> Any:
    """`scipy.special._ufuncs` with a placeholder parent package that is removed afterwards, so
    that a later `import scipy.special` runs the real package (which reuses the loaded module).
    """
    scipy_spec = importlib.util.find_spec("scipy")
    if scipy_spec is None or not scipy_spec.submodule_search_locations:
        raise ImportError("scipy is not installed")
    directory = f"{next(iter(scipy_spec.submodule_search_locations))}/special"
    finder = importlib.machinery.FileFinder(
        directory,
        (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
    )
    spec = finder.find_spec(_UFUNCS)
    if spec is None or spec.loader is None:
        raise ImportError(f"no compiled {_UFUNCS} in {directory}")
    placeholder = types.ModuleType(_PACKAGE)
    placeholder.__path__ = [directory]
    sys.modules[_PACKAGE] = placeholder
    try:
        module = importlib.util.module_from_spec(spec)
        sys.modules[_UFUNCS] = module
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(_UFUNCS, None)
        raise
    finally:
        if sys.modules.get(_PACKAGE) is placeholder:
            del sys.modules[_PACKAGE]
    return module


@functools.cache
def betaincinv() -> Any:
    """scipy's `betaincinv(a, b, y)` ufunc: x with I_x(a, b) = y (the Beta(a, b) quantile)."""
    if _PACKAGE not in sys.modules:
        try:
            return _load_ufuncs_alone().betaincinv
        except (ImportError, AttributeError, OSError):
            pass
    from scipy.special import betaincinv as public

    return public
