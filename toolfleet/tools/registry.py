"""The registry: the single source of truth for tools.

The model's ``tools`` list, validation, planning and the worker's handler lookup all read the same
:class:`ToolSpec` objects from here.
"""

from __future__ import annotations

import importlib
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

    def add(self, spec: ToolSpec) -> ToolSpec:
        """Register ``spec``. Raises :class:`ConfigurationError` for a non-tool or a duplicate name."""
        if not isinstance(spec, ToolSpec):
            raise ConfigurationError(f"{spec!r} is not a tool; decorate it with @tool")
        if spec.name in self._tools and self._tools[spec.name] is not spec:
            raise ConfigurationError(f"a tool named {spec.name!r} is already registered")
        self._tools[spec.name] = spec
        return spec

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

    def load_module(self, module_name: str) -> list[ToolSpec]:
        """Import ``module_name`` and register every :class:`ToolSpec` at its top level.

        Raises :class:`ConfigurationError` if it cannot be imported or holds no tool.
        """
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigurationError(f"cannot import tool module {module_name!r}: {exc}") from exc
        found = [value for value in vars(module).values() if isinstance(value, ToolSpec)]
        if not found:
            raise ConfigurationError(f"module {module_name!r} defines no @tool")
        return [self.add(spec) for spec in found]


def default_registry(modules: Iterable[str] = ()) -> Registry:
    """The built-in tools (workspace files, ``run_command``, ``read_output``) plus the tools of
    ``modules`` (dotted import paths)."""
    from .command import run_command
    from .files import edit_file, grep, list_dir, read_file, write_file
    from .stored_output import read_output

    registry = Registry([read_file, list_dir, grep, write_file, edit_file, run_command, read_output])
    for name in modules:
        registry.load_module(name)
    return registry
