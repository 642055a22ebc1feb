"""Replay environments: the key naming a bundle's Python environment, building and caching it, and
a replay run inside it."""
