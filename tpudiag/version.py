"""The package version, in the bottom layer so every module may name it."""

__version__ = "0.1.0"
