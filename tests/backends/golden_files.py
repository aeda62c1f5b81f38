"""Golden files: generated scripts and plans compared with what was reviewed.

Refresh after an intended change with: PHALANX_UPDATE_GOLDEN=1 pytest tests/backends
"""

import os
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"
REFRESH = "PHALANX_UPDATE_GOLDEN=1 pytest tests/backends"


def assert_golden(name: str, text: str, what: str) -> None:
    golden = GOLDEN / name
    if os.environ.get("PHALANX_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden}; create it with: {REFRESH}"
    assert text == golden.read_text(), f"{what} changed; if intended, refresh with: {REFRESH}"
