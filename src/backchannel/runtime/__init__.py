"""The runtime: threads, runs, checkpoints and a store, with the LangGraph SDK client's surface."""

from backchannel._ids import assistant_id_for
from backchannel.runtime.backends import DEFAULT_STORE, open_storage
from backchannel.runtime.local import LocalRuntime
from backchannel.runtime.modes import STREAM_MODES, StreamPart
from backchannel.runtime.retention import StoreTTLConfig, ThreadTTLConfig
from backchannel.runtime.storage import Storage

__all__ = ["DEFAULT_STORE", "STREAM_MODES", "LocalRuntime", "Storage", "StoreTTLConfig", "StreamPart",
           "ThreadTTLConfig", "assistant_id_for", "open_storage"]
