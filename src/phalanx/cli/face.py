"""Which face the commands talk to: this machine's store (``LocalFace``). Every command makes its
one call on ``face()`` and renders the result, so the same commands serve a remote face."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..api.face import Face


@functools.lru_cache(maxsize=1)
def face() -> "Face":
    from ..api.face import LocalFace

    return LocalFace()
