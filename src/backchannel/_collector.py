"""Python's cycle collector held off while a long thread's state is built from storage.

Each few hundred new containers start a young collection, every ten of those a middle one over the containers
made so far, and as they pile up a full one over everything the process holds: a 10,000-message state (tens of
thousands of dicts, lists and messages, and no cycle among them) was looked at several times over while it was
being built. Paused, the collector looks at the new objects once, at its first collection after (other threads
that allocate meanwhile have their collections deferred too, not lost).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["collector_paused"]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Hold off the cycle collector for the block (left as it was if the caller had turned it off). The block must
    not await: other tasks would run with the collector off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
