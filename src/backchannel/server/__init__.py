"""The server: the LangGraph HTTP API over a :class:`~backchannel.runtime.LocalRuntime`.

Needs the ``server`` extra (``pip install "backchannel[server]"``). Run it with
``backchannel serve``, or build the ASGI app yourself with :func:`create_app`.
"""

from backchannel.server.app import create_app
from backchannel.server.demo_page import DemoPage
from backchannel.server.serving import DEFAULT_PORT, import_agents, serve, served

__all__ = ["DEFAULT_PORT", "DemoPage", "create_app", "import_agents", "serve", "served"]
