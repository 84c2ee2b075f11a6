"""The tool SDK: ``@tool``, the registry, the built-in workspace tools."""

from .context import ToolContext
from .registry import Registry, default_registry
from .resources import EVERYTHING, overlaps, path_resource, paths
from .spec import ToolSpec, tool, tool_from_schema

__all__ = [
    "EVERYTHING",
    "Registry",
    "ToolContext",
    "ToolSpec",
    "default_registry",
    "overlaps",
    "path_resource",
    "paths",
    "tool",
    "tool_from_schema",
]
