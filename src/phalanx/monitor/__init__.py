"""Observing jobs: log tailing (metrics and resource sampling grow here)."""
