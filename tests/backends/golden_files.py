"""Golden files: generated scripts, plans and manifests compared with what was reviewed.

Refresh after an intended change with: PHALANX_UPDATE_GOLDEN=1 pytest tests/backends (or the
folder whose golden/ changed, e.g. tests/kubernetes)
"""

import os
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"


def check_golden(folder: Path, name: str, text: str, what: str) -> None:
    """``text`` against ``folder/name`` (written instead with PHALANX_UPDATE_GOLDEN=1)."""
    golden = folder / name
    refresh = f"PHALANX_UPDATE_GOLDEN=1 pytest {folder.parent.relative_to(Path(__file__).parents[2])}"
    if os.environ.get("PHALANX_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden}; create it with: {refresh}"
    assert text == golden.read_text(), f"{what} changed; if intended, refresh with: {refresh}"


def assert_golden(name: str, text: str, what: str) -> None:
    check_golden(GOLDEN, name, text, what)
