"""``python -m phalanx.supervise JOB_ID``: a detached job's supervisor (started by
``detached.spawn_supervisor``), supervising a recorded job to its end."""

import os
import sys

from .. import config
from ..core.paths import HomePaths, read_json
from ..core.plan import Plan
from ..store import open_store
from .job import supervise
from .relay import lease_ttl


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    ttl = lease_ttl()  # out of the environment before any rank starts
    home = HomePaths(config.home())
    store = open_store(home.db)
    record = store.get(args[0])
    plan = Plan.from_dict(read_json(record.paths.plan))

    def say(text: str) -> None:
        print(f"phalanx: {text}", flush=True)

    # Queued: this process leaves the job to its queue, which starts a supervisor like it once the
    # job is admitted (admission.advance); 1,000 queued jobs are rows, not processes.
    code = supervise(store, home, record, plan, events=say, wait_queued=False, lease_ttl=ttl)
    sys.stdout.flush()
    os._exit((code or 0) & 0xFF)


main()
