"""Schema versions: each backend lists its forward migrations; a database records the ones applied.

Version ``n`` is the ``n``-th migration of the backend's list. A database opened
by older code than last migrated it is refused, so old code never writes rows
in a shape it does not know.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from backchannel.errors import SchemaVersionError

__all__ = ["VERSION_TABLE", "to_apply"]

VERSION_TABLE = "schema_migrations"

T = TypeVar("T")


def to_apply(current: int, migrations: Sequence[T], database: str) -> list[tuple[int, T]]:
    """The migrations a database at version ``current`` still needs, as ``(version, migration)``.

    Raises :class:`SchemaVersionError` when the database is newer than this code.
    """
    if current > len(migrations):
        raise SchemaVersionError(
            f"the database {database} has schema version {current}, but this version of backchannel knows "
            f"versions up to {len(migrations)}: upgrade backchannel to open it")
    return list(enumerate(migrations, 1))[current:]
