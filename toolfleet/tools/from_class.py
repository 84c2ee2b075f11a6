"""Tools from a class: each public method is a tool, the instance is the session's stored state
(issue 13, item 4).

::

    @dataclass
    class Shell:
        cwd: str = "/"

        @method(access="read", loop_check=False)
        def pwd(self) -> str:
            "Print the current directory."
            return self.cwd

        def cd(self, path: str) -> str:
            "Change directory."
            ...

    TOOLS = tools_from_class(Shell, prefix="sh_")   # sh_pwd, sh_cd; a --tools module may export TOOLS

Schemas come from the methods' signatures and docstrings as for ``@tool``
(:mod:`toolfleet.tools.spec`); ``self`` is not a parameter. Each method is a ``write`` unless
:func:`method` says otherwise; ``access`` may be a function of the arguments (a method that
writes only when given a file name). The class must have a JSON form (a dataclass or pydantic
model of JSON-able fields; a ``random.Random`` as :data:`~toolfleet.tools.state.JsonRandom`),
and ``cls()`` is the state of a session opened without one.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable
from typing import Any, get_type_hints

from ..errors import ConfigurationError, ToolFailure
from .spec import ToolSpec, tool
from .state import DEFAULT_MAX_BYTES, SessionState

_OPTIONS = "__toolfleet_method__"
_CTX = "_toolfleet_ctx"


def method(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Per-method options for :func:`tools_from_class`: those of ``@tool`` (``access`` — a
    string or a function of the arguments —, ``loop_check``, ``formatter``, ``timeout_s``,
    ``max_output_chars``, ``name``, ...). ``@method(skip=True)`` leaves a public method out."""

    def mark(func: Callable[..., Any]) -> Callable[..., Any]:
        setattr(func, _OPTIONS, options)
        return func

    return mark(fn) if fn is not None else mark


def tools_from_class(
    cls: type,
    *,
    state_name: str | None = None,
    prefix: str = "",
    methods: Iterable[str] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    default: Callable[[], Any] | None = None,
    expected_errors: tuple[type[BaseException], ...] = (ValueError, LookupError),
    **defaults: Any,
) -> list[ToolSpec]:
    """One tool per public method of ``cls`` defined on it (or the names in ``methods``), named
    ``prefix + method name``, sharing the :class:`SessionState` ``state_name`` (default: the
    class name in lower case) of type ``cls``. ``defaults`` are ``@tool`` options for every
    method (a method's :func:`method` options win). A method raising one of ``expected_errors``
    (default ``ValueError``, ``LookupError``: the model asked for something impossible) fails its
    call with ``EXECUTION_ERROR`` and the message ``"<Type>: <text>"`` without counting against
    the tool's circuit breaker; other exceptions count as the tool failing. Raises :class:`ConfigurationError` when the
    class has no JSON form, a method has no describable signature, or no method is left."""
    state = SessionState(state_name or cls.__name__.lower(), cls, default=default, max_bytes=max_bytes)
    names = list(methods) if methods is not None else [
        name for name, value in vars(cls).items()
        if not name.startswith("_") and inspect.isfunction(value)
        and not getattr(value, _OPTIONS, {}).get("skip")]
    specs = [_method_tool(cls, state, name, prefix, defaults, expected_errors) for name in names]
    if not specs:
        raise ConfigurationError(f"{cls.__name__} has no public method to make a tool of")
    return specs


def _method_tool(cls: type, state: SessionState, name: str, prefix: str, defaults: dict[str, Any],
                 expected_errors: tuple[type[BaseException], ...]) -> ToolSpec:
    func = getattr(cls, name, None)
    if not inspect.isfunction(func):
        raise ConfigurationError(f"{cls.__name__}.{name} is not a method")
    options = {"access": "write", **defaults, **getattr(func, _OPTIONS, {})}
    options.pop("skip", None)
    tool_name = options.pop("name", None) or f"{prefix}{name}"
    signature = inspect.signature(func)
    params = list(signature.parameters.values())[1:]  # without self
    try:
        hints = get_type_hints(func, include_extras=True)
    except Exception as exc:
        raise ConfigurationError(f"tool {tool_name}: cannot read type hints: {exc}") from exc

    def describe(**_: Any) -> Any:  # stands for the method while the schema is made
        raise AssertionError("not called")

    describe.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    describe.__annotations__ = {p.name: hints.get(p.name, Any) for p in params}
    describe.__doc__ = func.__doc__
    spec = tool(describe, name=tool_name, **options)
    if spec.context_param:
        raise ConfigurationError(f"tool {tool_name}: a method's session state is `self`; it takes no ctx")

    def handler(**kwargs: Any) -> Any:
        ctx = kwargs.pop(_CTX)
        try:
            return getattr(ctx.session, name)(**kwargs)
        except expected_errors as exc:
            raise ToolFailure(f"{type(exc).__name__}: {exc}", "check the arguments against the current state") from exc

    return dataclasses.replace(spec, handler=handler, context_param=_CTX, state=state)
