"""The errors backchannel raises, one type per thing that can go wrong."""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthenticationError",
    "BackchannelError",
    "ConflictError",
    "InvalidRequestError",
    "MaxIterationsError",
    "MiddlewareError",
    "ModelError",
    "NotFoundError",
    "RemoteError",
    "RunCancelled",
    "SchemaVersionError",
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
    """The model could not produce a reply (provider error, bad response)."""


class RunCancelled(BackchannelError):
    """A run was cancelled before it finished."""


class NotFoundError(BackchannelError, LookupError):
    """A thread, run, assistant, checkpoint or item does not exist (HTTP 404)."""


class ConflictError(BackchannelError):
    """The request conflicts with the current state, e.g. a busy thread with ``reject`` (HTTP 409)."""


class InvalidRequestError(BackchannelError, ValueError):
    """The request is malformed: bad arguments, a bad resume value (HTTP 422)."""

    def __init__(self, message: str, *, detail: Any = None) -> None:
        super().__init__(message)
        self.detail = detail


class SchemaVersionError(BackchannelError):
    """The database was migrated by a newer backchannel than this one."""


class AuthenticationError(BackchannelError):
    """A server refused the request's credentials: a missing or wrong API key (HTTP 401/403)."""


class RemoteError(BackchannelError):
    """Another server could not answer: unreachable, timed out, or failed (HTTP 5xx). Worth retrying."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
