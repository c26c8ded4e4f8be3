"""Ids: fresh ones for messages, runs and workers, and the ids LangGraph derives from names."""

from __future__ import annotations

import functools
import os
import random
import uuid

__all__ = ["assistant_id_for", "new_id"]

# A PRNG seeded from the OS (and reseeded in forked children) makes ids 3x faster than uuid4();
# ids are identifiers, not secrets.
_random = random.Random()
os.register_at_fork(after_in_child=_random.seed)


def new_id() -> str:
    """A fresh id in UUID4 form (as LangChain uses for messages)."""
    h = "%032x" % (_random.getrandbits(128) & _UUID4_CLEAR | _UUID4_SET)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_UUID4_CLEAR = ~((0xF << 76) | (0x3 << 62))  # the version nibble and the variant bits
_UUID4_SET = (0x4 << 76) | (0x2 << 62)


# LangGraph derives a registered graph's assistant id as uuid5(this namespace, graph_id).
_ASSISTANT_NAMESPACE = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")


@functools.lru_cache(maxsize=1024)
def assistant_id_for(graph_id: str) -> str:
    """The assistant id of a registered graph, as LangGraph computes it."""
    return str(uuid.uuid5(_ASSISTANT_NAMESPACE, graph_id))
