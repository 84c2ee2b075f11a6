"""The registry: the single source of truth for tools.

The model's ``tools`` list, validation, planning and the worker's handler lookup all read the same
:class:`ToolSpec` objects from here.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import traceback
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import ConfigurationError
from .spec import ToolSpec


class Registry:
    """Tools by name. ``Registry([spec, ...])``; iteration is in registration order."""

    def __init__(self, tools: Iterable[ToolSpec] = ()) -> None:
        self._tools: dict[str, ToolSpec] = {}
        for spec in tools:
            self.add(spec)

    def add(self, spec: ToolSpec, *, replace: bool = False) -> ToolSpec:
        """Register ``spec``; ``replace=True`` puts it in place of a tool of the same name.
        Raises :class:`ConfigurationError` for a non-tool or a duplicate name not to be replaced."""
        if not isinstance(spec, ToolSpec):
            raise ConfigurationError(f"{spec!r} is not a tool; decorate it with @tool")
        if spec.name in self._tools and self._tools[spec.name] is not spec and not replace:
            raise ConfigurationError(
                f"a tool named {spec.name!r} is already registered (to replace a built-in, say so: "
                f"`toolfleet worker --replace {spec.name}` or default_registry(..., replace=[...]); "
                "or leave the built-ins out with --no-builtins)")
        self._tools[spec.name] = spec
        return spec

    @classmethod
    def from_catalog(cls, settings: Any, local: Registry | None = None, client: Any = None) -> Registry:
        """The tools the live workers of ``settings.namespace`` publish, usable without importing
        their code, over ``local`` (default: the built-ins). See
        :func:`toolfleet.tools.published.catalog_registry` (which spec wins; raises
        :class:`~toolfleet.errors.BrokerUnavailable` if Redis does not answer)."""
        from .published import catalog_registry

        return catalog_registry(settings, local, client)

    def get(self, name: str) -> ToolSpec | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def queues(self) -> list[str]:
        """The distinct queues of the registered tools."""
        return sorted({spec.queue for spec in self})

    def chat_tools(self) -> list[dict[str, Any]]:
        """The ``tools`` list for OpenAI Chat Completions:
        ``[{"type": "function", "function": {"name", "description", "parameters"}}]``."""
        return [
            {
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": spec.parameters,
                },
            }
            for spec in self
        ]

    def load_module(self, module_name: str, replace: Iterable[str] = ()) -> list[ToolSpec]:
        """Import ``module_name`` and register every :class:`ToolSpec` at its top level, and those
        of a top-level list or tuple of tools (``TOOLS = tools_from_class(...)``); tools named in
        ``replace`` take the place of a tool registered before under that name.

        Raises :class:`ConfigurationError` if it cannot be imported (any exception its import
        raises: a SyntaxError, a RuntimeError of its top-level code, a missing package; the message
        is one line naming the file and line where it failed, issue 15 point 6) or holds no tool.
        """
        importable = _importable(module_name)
        try:
            module = importlib.import_module(importable)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (module_name == exc.name or module_name.startswith(f"{exc.name}.")):
                raise ConfigurationError(  # a package the module itself imports: where it does
                    f"cannot import tool module {module_name!r}{_where_failed(exc, module_name)}: "
                    f"{type(exc).__name__}: {exc}") from None
            raise ConfigurationError(
                f"cannot import tool module {module_name!r}: no module of that name on the Python path; give a "
                "dotted module name importable here (set PYTHONPATH to its folder) or the path of a .py file") from None
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - any failure of the module's own code
            raise ConfigurationError(f"cannot import tool module {module_name!r}{_where_failed(exc, module_name)}: "
                                     f"{type(exc).__name__}: {exc}") from None
        found: list[ToolSpec] = []
        for value in vars(module).values():
            group = value if isinstance(value, (list, tuple)) else (value,)
            found += [v for v in group if isinstance(v, ToolSpec) and not any(v is f for f in found)]
        if not found:
            raise ConfigurationError(f"module {module_name!r} defines no @tool")
        names = set(replace)
        return [self.add(spec, replace=spec.name in names) for spec in found]


def _importable(module_name: str) -> str:
    """``module_name`` as a dotted name to import: a path to a ``.py`` file (``./my_tools.py``)
    puts its folder first on ``sys.path`` and becomes the file's stem (so worker pool processes
    and pickled references find it by that name). Raises :class:`ConfigurationError` for a
    ``.py`` path that is not a file."""
    if not module_name.endswith(".py") and os.sep not in module_name:
        return module_name
    import sys

    path = os.path.realpath(module_name)
    if not os.path.exists(path):
        raise ConfigurationError(f"cannot import tool module {module_name!r}: no such file ({path}); give the path "
                                 "of a .py file, or a dotted module name")
    if not path.endswith(".py") or not os.path.isfile(path):
        raise ConfigurationError(f"cannot import tool module {module_name!r}: {path} is not a .py file; give the "
                                 "path of a .py file, or a dotted module name")
    folder, stem = os.path.split(path[:-3])
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return stem


def default_registry(modules: Iterable[str] = (), *, builtins: bool = True, replace: Iterable[str] = ()) -> Registry:
    """The built-in tools (workspace files, ``run_command``, ``read_output``; none with
    ``builtins=False``) plus the tools of ``modules`` (dotted import paths). A module's tool
    named like a built-in is refused unless its name is in ``replace`` (then it takes the
    built-in's place). Raises :class:`ConfigurationError` for a name in ``replace`` that no
    module's tool has."""
    from .command import run_command
    from .files import edit_file, grep, list_dir, read_file, write_file
    from .stored_output import read_output

    registry = Registry([read_file, list_dir, grep, write_file, edit_file, run_command, read_output]
                        if builtins else [])
    replace = list(replace)
    loaded: set[str] = set()
    for name in modules:
        loaded |= {spec.name for spec in registry.load_module(name, replace)}
    missing = sorted(set(replace) - loaded)
    if missing:
        raise ConfigurationError(f"--replace {', '.join(missing)}: no tool module defines a tool of that name")
    return registry


def _where_failed(exc: BaseException, module_name: str) -> str:
    """`` (FILE, line N)`` where importing ``module_name`` failed: a SyntaxError's own place, else
    the deepest frame in the module's file, else the deepest frame outside the import machinery;
    ``""`` when nothing is known (the module was not found)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" ({exc.filename}, line {exc.lineno})"
    try:
        spec = importlib.util.find_spec(module_name)
        origin = spec.origin if spec else None
    except (Exception, SystemExit):  # noqa: BLE001 - a parent package that fails too
        origin = None
    machinery = (os.path.dirname(importlib.__file__), __file__)
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(("<frozen", *machinery))]
    own = [f for f in frames if origin and f.filename == origin]
    frame = (own or frames or [None])[-1]
    return f" ({frame.filename}, line {frame.lineno})" if frame else ""
