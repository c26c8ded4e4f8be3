"""The runtime: threads, runs, checkpoints and a store, with the LangGraph SDK client's surface."""

from backchannel.runtime.local import DEFAULT_STORE, LocalRuntime, assistant_id_for
from backchannel.runtime.modes import STREAM_MODES, StreamPart
from backchannel.runtime.storage import Storage, open_storage

__all__ = ["DEFAULT_STORE", "STREAM_MODES", "LocalRuntime", "Storage", "StreamPart", "assistant_id_for",
           "open_storage"]
