"""Finds its assets relative to its own file, wherever it is run from."""

from pathlib import Path

from observe import record

HERE = Path(__file__).resolve().parent
labels = (HERE.parent / "assets" / "labels.txt").read_text().split()
print(f"labels={len(labels)} first={labels[0]}")
(HERE / "report.txt").write_text(f"{len(labels)} labels\n")
record(globals())
