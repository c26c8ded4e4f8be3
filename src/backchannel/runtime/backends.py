"""Choosing a storage backend from a URL: the one place that knows every backend."""

from __future__ import annotations

from backchannel.runtime.storage import Storage

__all__ = ["DEFAULT_STORE", "open_storage"]

DEFAULT_STORE = "sqlite:///~/.backchannel/state.db"


def open_storage(url: str | Storage) -> Storage:
    """A backend from a URL: ``"memory"``, ``"sqlite:///path/to/file.db"`` (``~`` expands), a path, or
    ``"postgresql://user:password@host/database"`` (needs the ``postgres`` extra). A backend is returned as is."""
    if not isinstance(url, str):
        return url
    if url in ("memory", ":memory:"):
        from backchannel.runtime.memory import MemoryStorage

        return MemoryStorage()
    if url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        return _postgres(url)
    from backchannel.runtime.sqlite import SQLiteStorage

    if url in ("sqlite://:memory:", "sqlite:///:memory:"):
        return SQLiteStorage(":memory:")
    if url.startswith("sqlite:///"):
        return SQLiteStorage(url.removeprefix("sqlite:///"))
    if "://" in url:
        scheme = url.split("://", 1)[0]
        raise ValueError(f"unsupported store URL {url!r}: scheme {scheme!r}; use 'memory', 'sqlite:///path' "
                         "or 'postgresql://user:password@host/database'")
    return SQLiteStorage(url)


def _postgres(url: str) -> Storage:
    try:
        from backchannel.runtime.postgres import PostgresStorage
    except ImportError as exc:
        raise ImportError(f"a Postgres store needs psycopg 3 ({exc}): pip install 'backchannel[postgres]'") from exc
    return PostgresStorage(url)
