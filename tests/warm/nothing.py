"""Does nothing: the cheapest warm start (tests/warm/conftest.py starts pools with it)."""

