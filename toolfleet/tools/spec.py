"""The tool SDK: ``@tool`` turns a typed, documented function into a :class:`ToolSpec`.

The JSON Schema of the arguments is derived from the signature through a generated pydantic model
(the idea of openai-agents' ``function_schema``): type hints and ``Annotated[..., Field(...)]`` give
types and constraints, the docstring (Google, reST or numpydoc, via ``docstring_parser``) gives the
tool's description and each parameter's. Unknown parameters are refused
(``additionalProperties: false``). A parameter annotated ``ToolContext`` (or named ``ctx``) is not
part of the schema: the worker passes the call's context there.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_type_hints

import docstring_parser
from billiard.exceptions import SoftTimeLimitExceeded
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import ConfigDict, Field, create_model

from ..errors import ConfigurationError, ToolFailure
from .context import ToolContext
from .docstrings import doc_text
from .resources import resource_fn

Access = Literal["read", "write"]
Risk = Literal["low", "medium", "high"]
ResourceFn = Callable[[Mapping[str, Any]], Iterable[str]]
AccessFn = Callable[[Mapping[str, Any]], str]

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI and Anthropic both limit names to this
GROUP_SEPARATOR = "__"
"""Between a group's name and its tool's in a fleet tool name, ``GROUP__tool``: a hosted MCP
server's tools (:mod:`toolfleet.integrations.mcp_host`), a Responses namespace's functions
(:mod:`toolfleet.dispatcher.adapters.namespaces`)."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool: what the model sees (name, description, parameters) and how it runs.

    - ``access``: ``read`` or ``write``; with ``resources`` it decides what may run side by side.
    - ``resources``: function of the arguments returning resource strings
      (:mod:`toolfleet.tools.resources`); ``None`` means everything. :func:`tool` also takes a
      list of resource strings for calls that always touch the same ones (``[]``: nothing).
    - ``timeout_s``: default time limit of one call; ``timeout_arg`` names an argument that may
      lower or raise it per call, up to ``max_timeout_s``.
    - ``max_output_chars``: output budget of the text the model reads.
    - ``queue``: the Celery queue (under the namespace) its calls are routed to; by default the
      tool's own name, so a call only reaches workers that serve its tool. Tools may share a queue
      (e.g. ``"gpu"``); then every worker consuming it must serve all of them.
    - ``cancellable``: whether a running call may be stopped when its turn is cancelled; a tool
      that is not runs to its end and keeps its result.
    - ``idempotent``: whether running it twice is harmless (reads are; writes by default are not).
    - ``risk``: ``low``, ``medium`` or ``high``, what an approval policy keys on (default: ``low``
      for reads, ``medium`` for writes).
    - ``sensitive``: parameters whose values are secrets: masked in the audit trail, in approval
      requests and in the task arguments Flower shows.
    - ``command_arg``: the parameter that holds a shell command; the policy's command rules check it.
    - ``pollable``: a status check meant to be repeated: identical calls at least
      ``poll_interval_s`` apart are not a loop.
      A call of an idempotent tool whose worker died is simply run again.
    - ``journal``: whether executions go through the idempotency journal
      (:mod:`toolfleet.worker.journal`); default: the tool is a write and not idempotent (docs/design.md,
      "Side effects"). A write with neither journal nor idempotency gets ``WORKER_LOST`` when its
      worker dies under it.
    - ``idempotency_key``: function of the arguments returning the journal key (for example the
      order id of a refund), so the same effect asked for again, in any turn, is recognised;
      default: turn id + call id.
    - ``probe``: called with the handler's arguments (and context) when an execution started
      before and never recorded an outcome; it looks at the real state and returns ``None`` when
      the effect did not happen (the handler then runs), or what the handler would have returned
      when it did (replayed as the result). A ``ToolFailure`` it raises is the outcome; any other
      exception makes the call ``OUTCOME_UNKNOWN``.
    - ``health_check``: side-effect-free function without arguments that raises when the tool
      cannot work; a worker runs it before the tool's open circuit closes (default: the tool is
      served by a live worker).
    - ``state``: a :class:`~toolfleet.tools.state.SessionState` the worker loads into
      ``ctx.session`` before the handler and saves after a write call (also when it raised); the
      plan adds the resource ``session:<id>:<name>`` to every call (:mod:`toolfleet.tools.state`).
    - ``access_fn``: function of the arguments returning ``"read"`` or ``"write"``: the access of
      one call (``access`` is then ``"write"``, the widest; a failing function means write).
    - ``formatter``: function of the handler's return value giving the text the model reads
      (``content``); ``data`` is kept as usual. Default: strings as they are, other values as
      compact JSON (:mod:`toolfleet.worker.values`).
    - ``loop_check``: ``False`` opts the tool out of loop detection (a ``pwd`` may be asked often).
    """

    name: str
    description: str
    parameters: dict[str, Any]
    handler: Callable[..., Any] = field(repr=False, compare=False)
    access: Access = "write"
    resources: ResourceFn | None = field(default=None, repr=False, compare=False)
    timeout_s: float = 60.0
    timeout_arg: str | None = None
    max_timeout_s: float = 3600.0
    max_output_chars: int = 20_000
    queue: str = ""
    cancellable: bool = True
    idempotent: bool = False
    risk: Risk = "medium"
    sensitive: tuple[str, ...] = ()
    command_arg: str | None = None
    pollable: bool = False
    poll_interval_s: float = 1.0
    journal: bool = False
    idempotency_key: Callable[[Mapping[str, Any]], str] | None = field(default=None, repr=False, compare=False)
    probe: Callable[..., Any] | None = field(default=None, repr=False, compare=False)
    health_check: Callable[[], Any] | None = field(default=None, repr=False, compare=False)
    context_param: str | None = None
    state: Any = field(default=None, compare=False)
    access_fn: AccessFn | None = field(default=None, repr=False, compare=False)
    formatter: Callable[[Any], str] | None = field(default=None, repr=False, compare=False)
    loop_check: bool = True
    validator: Draft202012Validator = field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not self.queue:
            object.__setattr__(self, "queue", self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the handler directly (in-process, no worker): handy in tests and notebooks."""
        return self.handler(*args, **kwargs)

    def access_for(self, arguments: Mapping[str, Any]) -> str:
        """The access of one call: ``access_fn(arguments)`` when declared (``"write"`` if it
        fails or answers anything else), else ``access``."""
        if self.access_fn is None:
            return self.access
        try:
            return "read" if self.access_fn(arguments) == "read" else "write"
        except Exception:  # a broken access function must not break planning: the safe answer
            return "write"

    def time_limit_s(self, arguments: Mapping[str, Any]) -> float:
        """The call's time limit: the ``timeout_arg`` argument if given, else ``timeout_s``."""
        if self.timeout_arg and arguments.get(self.timeout_arg) is not None:
            return float(min(float(arguments[self.timeout_arg]), self.max_timeout_s))
        return self.timeout_s

    def idempotency_key_for(self, turn_id: str, call_id: str, arguments: Mapping[str, Any]) -> str:
        """The journal key of a call: ``idempotency_key(arguments)`` when the tool derives one
        (and it works), else ``turn_id:call_id``."""
        if self.idempotency_key is not None:
            try:
                derived = str(self.idempotency_key(arguments))
            except SoftTimeLimitExceeded:  # the call's time limit, not a broken key: under the fallback key
                raise  # a write done before under its own key would run again (worker/execute.py: not run)
            except Exception:  # a broken key function must not break the call: fall back per call
                derived = ""
            if derived:
                return f"arg:{derived}"
        return f"{turn_id}:{call_id}"

    def describe(self) -> dict[str, Any]:
        """Provider-neutral full description, as published in the worker catalog: schema, access,
        resources rule, limits, queue, ``version`` (:func:`toolfleet.tools.published.describe`)."""
        from .published import describe

        return describe(self)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    access: Access = "write",
    resources: ResourceFn | None = None,
    timeout_s: float = 60.0,
    timeout_arg: str | None = None,
    max_timeout_s: float = 3600.0,
    max_output_chars: int = 20_000,
    queue: str = "",
    cancellable: bool = True,
    idempotent: bool | None = None,
    risk: Risk | None = None,
    sensitive: tuple[str, ...] | list[str] = (),
    command_arg: str | None = None,
    pollable: bool = False,
    poll_interval_s: float = 1.0,
    journal: bool | None = None,
    idempotency_key: Callable[[Mapping[str, Any]], str] | None = None,
    probe: Callable[..., Any] | None = None,
    health_check: Callable[[], Any] | None = None,
    state: Any = None,
    formatter: Callable[[Any], str] | None = None,
    loop_check: bool = True,
) -> Any:
    """Decorator: ``@tool`` or ``@tool(access="read", resources=paths("path"))``.

    Returns a :class:`ToolSpec` (still callable like the function). Options are explained on
    :class:`ToolSpec`; ``access`` may be a function of the arguments (per-call access, the tool
    counting as a write where one access is needed); ``idempotent`` defaults to ``access == "read"``, ``journal`` to a
    non-idempotent write, ``risk`` to ``low`` for reads and ``medium`` for writes. Raises
    :class:`~toolfleet.errors.ConfigurationError` for a name providers refuse, an access other than
    read/write, an unknown risk level, a parameter without a JSON-representable type, a
    ``sensitive`` or ``command_arg`` name that is not a parameter, a non-positive limit, or an
    ``idempotency_key``/``probe`` on a tool that is not journaled.
    """

    access_fn, fixed = (access, "write") if callable(access) else (None, access)

    def build(func: Callable[..., Any]) -> ToolSpec:
        is_idempotent = fixed == "read" if idempotent is None else idempotent
        return make_spec(
            func,
            name=name,
            description=description,
            access=fixed,
            access_fn=access_fn,
            state=state,
            formatter=formatter,
            loop_check=loop_check,
            resources=resources,
            timeout_s=timeout_s,
            timeout_arg=timeout_arg,
            max_timeout_s=max_timeout_s,
            max_output_chars=max_output_chars,
            queue=queue,
            cancellable=cancellable,
            idempotent=is_idempotent,
            risk=("low" if fixed == "read" else "medium") if risk is None else risk,
            sensitive=tuple(sensitive),
            command_arg=command_arg,
            pollable=pollable,
            poll_interval_s=poll_interval_s,
            journal=(fixed == "write" and not is_idempotent) if journal is None else journal,
            idempotency_key=idempotency_key,
            probe=probe,
            health_check=health_check,
        )

    return build(fn) if fn is not None else build


def tool_from_schema(
    name: str,
    parameters: Mapping[str, Any],
    *,
    description: str = "",
    handler: Callable[..., Any] | None = None,
    access: Access = "write",
    resources: ResourceFn | None = None,
    **options: Any,
) -> ToolSpec:
    """A tool described by a JSON Schema rather than by a function's signature: for tools defined
    elsewhere (another framework's definitions, a benchmark, a remote service).

    ``parameters`` must be a JSON Schema (Draft 2020-12) for the arguments object; it is used as
    given (no ``additionalProperties`` added). ``handler`` is called with the arguments as keyword
    arguments, plus the call's :class:`ToolContext` as ``ctx`` when it has a parameter named
    ``ctx`` or annotated ``ToolContext`` (then that parameter); ``access`` may be a function of
    the arguments (as for :func:`tool`); without a handler, a call fails with
    ``EXECUTION_ERROR`` saying so. Other options are those of :func:`tool`. Raises
    :class:`ConfigurationError` for a name providers refuse or a schema that is not valid JSON
    Schema.
    """
    if not _NAME.match(name):
        raise ConfigurationError(f"tool name {name!r} must match {_NAME.pattern} (provider limit)")
    if callable(access):
        options["access_fn"], access = access, "write"
    if access not in ("read", "write"):
        raise ConfigurationError(f"tool {name}: access must be 'read' or 'write', not {access!r}")
    resources = resource_fn(resources, name)
    schema = dict(parameters)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ConfigurationError(f"tool {name}: parameters are not a valid JSON Schema: {exc.message}") from exc
    if handler is None:
        def handler(**_: Any) -> Any:
            raise ToolFailure(f"the tool {name} has no handler in this process", "it can be validated, not run")
    defaults: dict[str, Any] = {"timeout_s": 60.0, "max_output_chars": 20_000,
                                "context_param": _context_param(handler)}
    defaults.update(options)
    defaults.setdefault("idempotent", access == "read")
    defaults.setdefault("journal", access == "write" and not defaults["idempotent"])
    defaults.setdefault("risk", "low" if access == "read" else "medium")
    return ToolSpec(
        name=name,
        description=description,
        parameters=schema,
        handler=handler,
        access=access,
        resources=resources,
        validator=Draft202012Validator(schema),
        **defaults,
    )


def _context_param(handler: Callable[..., Any]) -> str | None:
    """The parameter of ``handler`` that takes the call's context: one annotated ``ToolContext``,
    else one named ``ctx``; ``None`` when there is none (or the signature cannot be read)."""
    try:
        params = inspect.signature(handler).parameters
    except (TypeError, ValueError):
        return None
    try:
        hints = get_type_hints(handler)
    except Exception:
        hints = {}
    for param in params.values():
        if hints.get(param.name) is ToolContext:
            return param.name
    return "ctx" if "ctx" in params else None


def make_spec(func: Callable[..., Any], *, name: str | None, description: str | None, **options: Any) -> ToolSpec:
    tool_name = name or func.__name__
    if not _NAME.match(tool_name):
        raise ConfigurationError(f"tool name {tool_name!r} must match {_NAME.pattern} (provider limit)")
    if options["access"] not in ("read", "write"):
        raise ConfigurationError(f"tool {tool_name}: access must be 'read' or 'write', not {options['access']!r}")
    if options["risk"] not in ("low", "medium", "high"):
        raise ConfigurationError(f"tool {tool_name}: risk must be low, medium or high, not {options['risk']!r}")
    for key in ("timeout_s", "max_timeout_s", "max_output_chars", "poll_interval_s"):
        if options[key] <= 0:
            raise ConfigurationError(f"tool {tool_name}: {key} must be positive")
    for key in ("idempotency_key", "probe"):
        if options.get(key) is not None and not options.get("journal"):
            raise ConfigurationError(
                f"tool {tool_name}: {key} needs the idempotency journal; declare journal=True "
                "(or leave the tool a non-idempotent write)"
            )
    options["resources"] = resource_fn(options.get("resources"), tool_name)
    doc = docstring_parser.parse(inspect.getdoc(func) or "")
    parameters, context_param = _schema(func, tool_name, {p.arg_name: p.description for p in doc.params})
    if options.get("state") is not None:
        from .state import SessionState

        if not isinstance(options["state"], SessionState):
            raise ConfigurationError(f"tool {tool_name}: state must be a SessionState, not {options['state']!r}")
        if context_param is None:
            raise ConfigurationError(f"tool {tool_name}: a tool with session state reads it from ctx.session; "
                                     "give the handler a `ctx: ToolContext` parameter")
    if options["timeout_arg"] and options["timeout_arg"] not in parameters["properties"]:
        raise ConfigurationError(f"tool {tool_name}: timeout_arg {options['timeout_arg']!r} is not a parameter")
    for declared in (*options["sensitive"], *([options["command_arg"]] if options["command_arg"] else [])):
        if declared not in parameters["properties"]:
            raise ConfigurationError(f"tool {tool_name}: {declared!r} (sensitive/command_arg) is not a parameter")
    text = description or doc_text(doc)
    Draft202012Validator.check_schema(parameters)
    return ToolSpec(
        name=tool_name,
        description=text.strip(),
        parameters=parameters,
        handler=func,
        context_param=context_param,
        validator=Draft202012Validator(parameters),
        **options,
    )


def _schema(
    func: Callable[..., Any], tool_name: str, param_docs: dict[str, str | None]
) -> tuple[dict[str, Any], str | None]:
    try:
        hints = get_type_hints(func, include_extras=True)
    except Exception as exc:
        raise ConfigurationError(f"tool {tool_name}: cannot read type hints: {exc}") from exc
    fields: dict[str, Any] = {}
    context_param = None
    for param in inspect.signature(func).parameters.values():
        hint = hints.get(param.name, Any)
        if hint is ToolContext or param.name == "ctx":
            context_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(f"tool {tool_name}: *args/**kwargs cannot be described to a model")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hint, Field(default, description=param_docs.get(param.name)))
    model = create_model(f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    try:
        schema = model.model_json_schema()
    except Exception as exc:
        raise ConfigurationError(f"tool {tool_name}: parameters have no JSON Schema: {exc}") from exc
    _strip_titles(schema)
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    schema["additionalProperties"] = False
    return schema, context_param


def _strip_titles(node: Any) -> None:
    if isinstance(node, dict):
        if isinstance(node.get("title"), str):
            node.pop("title")
        for value in node.values():
            _strip_titles(value)
    elif isinstance(node, list):
        for value in node:
            _strip_titles(value)
