"""``python -m phalanx.supervise JOB_ID``: a detached job's supervisor."""

from .detached import main

main()
