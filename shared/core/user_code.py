"""A researcher's own model factory or data loader, named in the run config as "package.module:function".

Importing it runs the operator's code in every service that builds the model or loads the data (the
cloud at creation, edges, clients): the control API that accepts a config is admin-only, and the cloud
can restrict which packages a config may name (FL_CLOUD_ALLOWED_IMPORTS). Every failure of that code
(a missing package, an exception inside it) becomes a `UserCodeError` naming the import path, so the
cloud answers 422 and a client logs which package its environment lacks.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any


class UserCodeError(ValueError):
    """Imported user code is missing, is not callable, or raised."""


# What user code may raise that is its failure, not the service's: any Exception, and SystemExit, which
# argparse or a bare sys.exit() raise; left alone it ended a client process or answered the cloud's 500.
# KeyboardInterrupt is not here: on the main thread it is the operator's Ctrl-C.
_FAILURES = (Exception, SystemExit)


def resolve(path: str, what: str) -> Callable[..., Any]:
    """The function an import path "package.module:function" names."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except _FAILURES as exc:  # ImportError, or whatever the module raises at import
        raise UserCodeError(f"cannot import the {what} {path!r}: {type(exc).__name__}: {exc}") from exc
    function = getattr(module, attribute, None)
    if not callable(function):
        raise UserCodeError(f"the {what} {path!r}: module {module_name!r} has no function {attribute!r}")
    return function


def call(path: str, what: str, *args: Any, **kwargs: Any) -> Any:
    """Calls the function `path` names; anything it raises becomes a UserCodeError saying whose it was."""
    function = resolve(path, what)
    try:
        return function(*args, **kwargs)
    except _FAILURES as exc:
        raise UserCodeError(f"the {what} {path!r} raised {type(exc).__name__}: {exc}") from exc


def is_allowed(path: str, prefixes: Iterable[str]) -> bool:
    """Whether the module of `path` is one of `prefixes` or inside one (no prefixes: any module)."""
    prefixes = [p for p in prefixes if p]
    module = path.partition(":")[0]
    return not prefixes or any(module == p or module.startswith(p + ".") for p in prefixes)
