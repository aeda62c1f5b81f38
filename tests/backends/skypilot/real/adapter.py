"""phalanx's SkyPilot backend started for real (``Backend.start``: stage the workdir, then the
launch thread) against a real API server with no cloud enabled, then stopped: what each node
reports. Argument: a scratch directory."""

import json
import signal
import sys
import time
from pathlib import Path

from phalanx.backends.registry import get_backend
from phalanx.core.paths import HomePaths, JobPaths, write_json
from phalanx.core.spec import Entrypoint, EntrypointKind, JobSpec, Resources

root = Path(sys.argv[1])
code = root / "code"
code.mkdir(parents=True)
(code / "train.py").write_text("print('hello')\n")
backend = get_backend("skypilot")


def run(job_id, stop=False, **options):
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, str(code / "train.py")), Resources(2, 1), name="t", backend="skypilot",
                   workdir=str(code), backend_options={"cpus": "2+", **options})
    paths = JobPaths(root / "jobs" / job_id)
    plan = backend.plan(spec, job_id, 0, HomePaths(root), backend.facts(spec))
    paths.root.mkdir(parents=True)
    write_json(paths.spec, spec.to_dict())
    handles = backend.start(plan, paths)
    if stop:
        handles[0].signal(signal.SIGTERM)
    deadline = time.monotonic() + 120
    while any(h.poll() is None for h in handles) and time.monotonic() < deadline:
        time.sleep(0.2)
    results = [h.poll() for h in handles]
    return {"exitcodes": [r.exitcode if r else None for r in results], "errors": [r.error if r else None for r in results],
            "stopped_by": [r.stopped_by if r else None for r in results],
            "agent_log": paths.agent_log(0, 0).read_text() if paths.agent_log(0, 0).exists() else "",
            "staged": (paths.skypilot_workdir(0) / "code" / "train.py").is_file()}


print(json.dumps({"cluster": run("real1"), "managed": run("real2", managed=True), "stopped": run("real3", stop=True)}))
