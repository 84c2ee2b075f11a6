"""The Berkeley Function Calling Leaderboard's parallel categories, translated to toolfleet tools.

Data: the ``bfcl-eval`` package on PyPI ships ``bfcl_eval/data/BFCL_v4_parallel.json``,
``BFCL_v4_parallel_multiple.json`` (one JSON object a line: ``id``, ``question``, ``function``)
and ``possible_answer/`` beside them (``id``, ``ground_truth``: one ``{function: {param:
[possible values…]}}`` per expected call). The package pulls a heavy dependency tree (torch via
sentence-transformers, vllm, …) that the data does not need, so it is used without it: an
installed ``bfcl_eval`` is read in place (found without importing it), otherwise the pinned wheel
is fetched once with ``pip download --no-deps`` into ``.toolfleet/cache/`` and read as a zip.

Types are BFCL's own names (Python's, and a few Java/JS ones); they map to JSON Schema as BFCL's
own ``GORILLA_TO_OPENAPI`` does, except ``any``, which here allows any value (BFCL sends it to
OpenAI as ``string``). Function names drop the dots providers refuse (``math.sum`` ->
``math_sum``), as BFCL does for OpenAI and Anthropic.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from toolfleet import Registry, tool_from_schema

VERSION = "2026.3.23"
FILES = ("BFCL_v4_parallel.json", "BFCL_v4_parallel_multiple.json")
CACHE = Path(__file__).resolve().parent.parent / ".toolfleet" / "cache" / "bfcl"
TYPES = {
    "dict": "object", "object": "object", "HashMap": "object",
    "float": "number", "number": "number", "double": "number",
    "integer": "integer", "int": "integer", "long": "integer", "short": "integer", "byte": "integer",
    "string": "string", "str": "string", "String": "string", "char": "string",
    "boolean": "boolean", "bool": "boolean", "Boolean": "boolean",
    "array": "array", "list": "array", "tuple": "array", "ArrayList": "array", "Array": "array",
    "any": None,
}
KEPT = ("description", "enum", "default", "minimum", "maximum", "format")


def read(relative: str) -> list[dict[str, Any]]:
    """One data file (path under bfcl_eval/data/) as a list of entries."""
    text = _data_text(relative)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _data_text(relative: str) -> str:
    spec = importlib.util.find_spec("bfcl_eval")  # does not run the package's __init__
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "data" / relative
        if path.exists():
            return path.read_text()
    wheel = _wheel()
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(f"bfcl_eval/data/{relative}").decode()


def _wheel() -> Path:
    found = sorted(CACHE.glob(f"bfcl_eval-{VERSION}-*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(CACHE),
                    f"bfcl-eval=={VERSION}"], check=True, timeout=300)
    return sorted(CACHE.glob(f"bfcl_eval-{VERSION}-*.whl"))[0]


def tool_name(name: str) -> str:
    return name.replace(".", "_")


def translate(node: dict[str, Any], top: bool = False) -> dict[str, Any]:
    """A BFCL parameter schema as JSON Schema (Draft 2020-12). Raises KeyError on an unknown type."""
    out: dict[str, Any] = {}
    kind = node.get("type")
    if kind is not None:
        mapped = TYPES[kind]
        if mapped is not None:
            out["type"] = mapped
    out.update({key: node[key] for key in KEPT if key in node})
    if "properties" in node:
        out["properties"] = {name: translate(sub) for name, sub in node["properties"].items()}
    if "required" in node:
        out["required"] = list(node["required"])
    if isinstance(node.get("items"), dict):
        out["items"] = translate(node["items"])
    if top:
        out["type"] = "object"
        out.setdefault("properties", {})
        out["additionalProperties"] = False  # an unknown parameter is a mistake, as BFCL's checker says
    return out


def registry(functions: list[dict[str, Any]]) -> Registry:
    """The functions of one entry as tools (validation only: no handler runs)."""
    return Registry(
        tool_from_schema(tool_name(f["name"]), translate(f["parameters"], top=True),
                         description=f.get("description", ""), access="read", resources=lambda a: [])
        for f in functions
    )


def first_answer(values: list[Any]) -> tuple[bool, Any]:
    """(present, value) from a parameter's possible answers: the first one; ``""`` means the
    parameter is left out (BFCL's marker for "optional"); a dict answer holds possible answers
    per key in turn."""
    value = values[0]
    if value == "":
        return False, None
    if isinstance(value, dict):
        inner = {}
        for key, options in value.items():
            present, chosen = first_answer(options) if isinstance(options, list) else (True, options)
            if present:
                inner[key] = chosen
        return True, inner
    return True, value
