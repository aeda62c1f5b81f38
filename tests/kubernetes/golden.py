"""Golden manifests: what phalanx creates in a cluster, compared with what was reviewed.

Refresh after an intended change with: PHALANX_UPDATE_GOLDEN=1 pytest tests/kubernetes
"""

from pathlib import Path

from ..backends.golden_files import check_golden

GOLDEN = Path(__file__).parent / "golden"


def assert_golden(name: str, text: str, what: str) -> None:
    check_golden(GOLDEN, name, text, what)
