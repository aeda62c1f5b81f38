"""The warm pools of the differential tests: a directory per test module, the warm tests' fixture."""

from ..warm.conftest import pool_dir  # noqa: F401 - a fixture, found by name

__all__ = ["pool_dir"]
