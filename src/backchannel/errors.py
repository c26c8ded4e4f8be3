"""The errors backchannel raises, one type per thing that can go wrong, all under :class:`BackchannelError`.

The tree, with the HTTP status a server answers each with (``backchannel.server``)
and the status a ``RemoteRuntime`` turns back into the same class::

    BackchannelError
    ├── MaxIterationsError        a run made more model calls than its agent allows
    ├── MiddlewareError           a middleware hook raised (names the middleware and the hook)
    ├── ModelError                the model could not produce a reply (status, provider, retryable)
    │   ├── ModelAuthenticationError   the provider refused the key (401, 403)
    │   │   └── MissingAPIKeyError     no key: names the variable to set
    │   ├── ModelRequestError          the provider refused the request (4xx)
    │   ├── ModelRateLimitError        too many requests (429): retryable
    │   ├── ModelServerError           the provider failed or is overloaded (5xx, 529): retryable
    │   └── ModelConnectionError       the provider could not be reached: retryable
    ├── ToolError                 raised by a tool: the model gets the message as an error result
    ├── ToolArgumentsError        the model's arguments for a tool do not match its schema (also a ValueError)
    ├── ToolDefinitionError       a tool models cannot call: a bad name, Args: naming no parameter (a ValueError)
    ├── NotFoundError             no such thread, run, assistant, checkpoint or item (404; also a LookupError)
    ├── ConflictError             the request conflicts with the current state, e.g. a busy thread (409)
    ├── InvalidRequestError       bad arguments, a bad resume value, an option not supported (422; a ValueError)
    ├── AuthenticationError       a server refused the credentials (401, 403)
    ├── RemoteError               another server was unreachable, timed out or failed (5xx): worth retrying
    ├── StorageUnavailableError   the database could not be reached, or could not commit a write (503): retry
    ├── LostRunError              a write for a run this process no longer runs (another took it over)
    ├── SchemaVersionError        the database was migrated by a newer backchannel
    ├── HandoffError              a handoff could not be proposed or decided
    └── ConfigError               the configuration file cannot be used (names the file and the key)

Errors of the caller's own making that Python already names stay Python's:
a misspelt keyword argument is a :class:`TypeError`, as in ``langgraph_sdk``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthenticationError",
    "BackchannelError",
    "ConfigError",
    "ConflictError",
    "HandoffError",
    "InvalidRequestError",
    "LostRunError",
    "MaxIterationsError",
    "MiddlewareError",
    "MissingAPIKeyError",
    "ModelAuthenticationError",
    "ModelConnectionError",
    "ModelError",
    "ModelRateLimitError",
    "ModelRequestError",
    "ModelServerError",
    "NotFoundError",
    "RemoteError",
    "SchemaVersionError",
    "StorageUnavailableError",
    "ToolArgumentsError",
    "ToolDefinitionError",
    "ToolError",
]


class BackchannelError(Exception):
    """Base class of every error backchannel raises on purpose."""


class MaxIterationsError(BackchannelError):
    """A run made more model calls than its agent's ``max_iterations`` allows."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the agent reached its limit of {limit} model calls without finishing (raise it with the "
                         "agent's max_iterations, or a run's config recursion_limit)")
        self.limit = limit


class MiddlewareError(BackchannelError):
    """A middleware hook raised; names the middleware and the hook."""

    def __init__(self, middleware: str, hook: str, error: BaseException) -> None:
        super().__init__(f"middleware {middleware!r} failed in {hook}: {type(error).__name__}: {error}")
        self.middleware = middleware
        self.hook = hook
        self.error = error


class ModelError(BackchannelError):
    """The model could not produce a reply (provider error, bad response).

    ``provider`` names the provider (``"openai"``, ``"anthropic"``, ...), ``status`` is the HTTP status
    it answered with (``None`` when it never answered), and ``retryable`` says whether the same call
    may succeed later (rate limits, overload, outages, lost connections).
    """

    retryable_by_default = False

    def __init__(self, message: str, *, provider: str | None = None, status: int | None = None,
                 retryable: bool | None = None) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status
        self.retryable = self.retryable_by_default if retryable is None else retryable


class ModelAuthenticationError(ModelError):
    """The provider refused the credentials: a missing, wrong or unauthorised API key (HTTP 401/403)."""


class MissingAPIKeyError(ModelAuthenticationError):
    """No API key for the provider; ``env_var`` is the environment variable to set."""

    def __init__(self, provider: str, env_var: str, model: str) -> None:
        super().__init__(f"{env_var} is not set: export {env_var}=... to use {provider}:{model} "
                         "(or pass api_key=...)", provider=provider)
        self.env_var = env_var


class ModelRequestError(ModelError):
    """The provider refused the request itself: a bad parameter, an unknown model (HTTP 4xx). Not retryable."""


class ModelRateLimitError(ModelError):
    """Too many requests or tokens for the account (HTTP 429); retry later."""

    retryable_by_default = True


class ModelServerError(ModelError):
    """The provider failed or is overloaded (HTTP 5xx, 529, a timeout it reported); retry later."""

    retryable_by_default = True


class ModelConnectionError(ModelError):
    """The provider could not be reached, or did not answer in time; retry later."""

    retryable_by_default = True


class ToolError(BackchannelError):
    """Raise from a tool to answer the model with this message as an error result, verbatim."""


class ToolArgumentsError(BackchannelError, ValueError):
    """The model's arguments for a tool do not match its schema."""


class ToolDefinitionError(BackchannelError, ValueError):
    """A tool is defined in a way models cannot use (a bad name, a docstring describing missing parameters)."""


class NotFoundError(BackchannelError, LookupError):
    """A thread, run, assistant, checkpoint or item does not exist (HTTP 404)."""


class ConflictError(BackchannelError):
    """The request conflicts with the current state, e.g. a busy thread with ``reject`` (HTTP 409)."""


class InvalidRequestError(BackchannelError, ValueError):
    """The request is malformed: bad arguments, a bad resume value, an option not supported (HTTP 422)."""

    def __init__(self, message: str, *, detail: Any = None) -> None:
        super().__init__(message)
        self.detail = detail


class AuthenticationError(BackchannelError):
    """A server refused the request's credentials: a missing or wrong API key (HTTP 401/403)."""


class RemoteError(BackchannelError):
    """Another server could not answer: unreachable, timed out, or failed (HTTP 5xx). Worth retrying."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class StorageUnavailableError(BackchannelError):
    """The database could not be reached, or failed to commit a write (HTTP 503): nothing was acknowledged.

    The runtime keeps trying on its own and resumes its runs once the database is back; a caller may
    retry the request (a write that failed as its commit was cut off may have landed: read before
    writing again where a duplicate matters).
    """


class LostRunError(BackchannelError):
    """A write for a run was refused: this process no longer runs it.

    Every write a run makes carries the token of the claim that started it; once
    another process has taken the run over (this one missed its heartbeats for a
    lease, e.g. stalled) or it ended, the old claim's writes change nothing, and
    the run stops here (it continues, or ended, where it is now).
    """


class SchemaVersionError(BackchannelError):
    """The database was migrated by a newer backchannel than this one."""


class HandoffError(BackchannelError):
    """A handoff could not be proposed or decided (nothing to summarise, no handoff waiting, ...)."""


class ConfigError(BackchannelError):
    """The configuration file cannot be used; the message names the file and the key."""
