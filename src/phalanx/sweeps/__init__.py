"""Sweeps: search spaces written inline in script arguments, strategies, and the trial runner."""
