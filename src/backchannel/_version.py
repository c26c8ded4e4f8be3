"""The version of backchannel, in a module of its own so any layer can read it without importing the rest."""

__version__ = "0.1.0"
