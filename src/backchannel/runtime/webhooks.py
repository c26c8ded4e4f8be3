"""Webhooks: a run created with ``webhook=URL`` has its outcome POSTed there when it ends.

The payload is LangGraph's: the run, its final ``status``, ``values`` and,
for a failed run, ``error``. Delivery is retried with backoff when the
receiver is unreachable or answers 5xx or 429; other answers are final.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from backchannel.errors import InvalidRequestError

__all__ = ["RETRY_DELAYS", "check_webhook_url", "post_webhook"]

logger = logging.getLogger("backchannel")

RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0)  # seconds before each retry


def check_webhook_url(url: str) -> None:
    """Raise :class:`InvalidRequestError` unless ``url`` is an absolute http(s) URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidRequestError(f"webhook must be an absolute http(s) URL, not {url!r}")


async def post_webhook(url: str, payload: Mapping[str, Any]) -> None:
    """POST ``payload`` as JSON to ``url``, retrying transient failures (``RETRY_DELAYS``); a refusal is logged."""
    import httpx

    async with httpx.AsyncClient(timeout=10.0) as client:
        for attempt in range(len(RETRY_DELAYS) + 1):
            try:
                response = await client.post(url, json=payload)
                if response.status_code < 400:
                    return
                if response.status_code != 429 and response.status_code < 500:
                    logger.warning("webhook %s refused run %s: HTTP %s", url, payload.get("run_id"),
                                   response.status_code)
                    return
                reason = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if attempt < len(RETRY_DELAYS):
                await asyncio.sleep(RETRY_DELAYS[attempt])
    logger.warning("webhook %s did not take run %s after %d attempts (%s)", url, payload.get("run_id"),
                   len(RETRY_DELAYS) + 1, reason)
