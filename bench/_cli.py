"""What every benchmark's command line shares: ``--quick``, ``--json`` (and ``--postgres`` where one measures
Postgres); the tables, then the JSON document when asked for."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, is_dataclass
from typing import Any, TextIO

Renderer = Callable[[dict[str, Any], TextIO], None]


def arguments(doc: str | None, quick: str, *, postgres: bool = False) -> argparse.ArgumentParser:
    """A parser with ``--quick`` (doing what ``quick`` says), ``--json``, and with ``postgres`` ``--postgres``
    (by default ``$BACKCHANNEL_TEST_POSTGRES``)."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--json", action="store_true", help="print JSON on stdout (the tables go to stderr)")
    if postgres:
        parser.add_argument("--postgres", default=os.environ.get("BACKCHANNEL_TEST_POSTGRES"),
                            help="a Postgres URL (each measurement gets a fresh schema in it)")
    return parser


def emit_report(results: dict[str, Any], renderers: Sequence[Renderer], as_json: bool,
                plain: Callable[[Any], Any] = lambda results: results) -> None:
    """Print the tables (to stderr when the JSON document goes to stdout), then the JSON if asked."""
    out = sys.stderr if as_json else sys.stdout
    for render in renderers:
        render(results, out)
    if as_json:
        json.dump(to_jsonable(plain(results)), sys.stdout, indent=2)
        print()


def to_jsonable(value: Any) -> Any:
    """``value`` with its dataclasses as dicts and its keys as strings."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_jsonable(v) for v in value]
    return value
