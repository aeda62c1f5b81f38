"""Golden manifests: what phalanx creates in a cluster, compared with what was reviewed.

Refresh after an intended change with: PHALANX_UPDATE_GOLDEN=1 pytest tests/kubernetes
"""

import os
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"
REFRESH = "PHALANX_UPDATE_GOLDEN=1 pytest tests/kubernetes"


def assert_golden(name: str, text: str, what: str) -> None:
    golden = GOLDEN / name
    if os.environ.get("PHALANX_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden}; create it with: {REFRESH}"
    assert text == golden.read_text(), f"{what} changed; if intended, refresh with: {REFRESH}"
