"""phalanx's SkyPilot calls (``backends/skypilot/client.py``), each made against a real API server
with the arguments phalanx passes: a wrong name or argument raises TypeError here; what comes back,
or what is raised, is reported by type. No cloud is enabled: launches end in SkyPilot's own error."""

import io
import json

import sky

from phalanx.backends.skypilot import client
from phalanx.errors import PhalanxError

task = client.load_task(sky, {"name": "phx-real-a0", "num_nodes": 2, "resources": {"cpus": "2+"}, "run": "true"})
log = io.StringIO()
out = {}


def attempt(name, fn):
    try:
        value = fn()
        out[name] = {"returned": None if value is None else type(value).__name__, "value": value if isinstance(value, (int, str, list)) else None}
    except PhalanxError as exc:
        out[name] = {"raised": type(exc).__name__, "exit_code": exc.exit_code, "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - what SkyPilot raised, by type
        out[name] = {"raised": type(exc).__name__, "module": type(exc).__module__, "message": client.one_line(exc)}


attempt("preflight", lambda: client.preflight({"name": "phx-real", "resources": {"cpus": "2+"}, "run": "true"}, "phx-check-a0"))
request = client.start_launch(sky, task, "phx-real-a0", managed=False)
out["launch_request"] = {"type": type(request).__name__, "is_str": isinstance(request, str)}
attempt("launch", lambda: client.wait_launch(sky, request, False, log))
attempt("launch_kept", lambda: client.wait_launch(sky, client.start_launch(sky, task, "mine", managed=False, down=False), False, log))
attempt("jobs_launch", lambda: client.wait_launch(sky, client.start_launch(sky, task, "phx-real-a0", managed=True), True, log))
attempt("tail", lambda: client.tail(sky, "phx-none-a0", 1, False, log))
attempt("jobs_tail", lambda: client.tail(sky, "phx-none-a0", 1, True, log))
attempt("running", lambda: client.running(sky, "phx-none-a0", 1, managed=False))
attempt("jobs_running", lambda: client.running(sky, "phx-none-a0", 1, managed=True))
attempt("stop", lambda: client.stop(sky, "phx-none-a0", 1, managed=False))
attempt("stop_kept", lambda: client.stop(sky, "mine", 1, managed=False, down=False))
attempt("stop_before_job", lambda: client.stop(sky, "phx-none-a0", None, managed=False))
attempt("jobs_stop", lambda: client.stop(sky, "phx-none-a0", 1, managed=True))
attempt("jobs_stop_by_name", lambda: client.stop(sky, "phx-none-a0", None, managed=True))
# A stop while the launch request is still running: api_cancel ends it, and waiting on it then raises.
provisioning = client.start_launch(sky, task, "phx-real-a1", managed=False)
attempt("stop_while_launching", lambda: client.stop(sky, "phx-real-a1", None, managed=False, launching=provisioning))
attempt("launch_after_stop", lambda: client.wait_launch(sky, provisioning, False, log))
out["outcomes"] = {code: client.outcome(sky, code) for code in (0, 100, 101, 102, 103, None)}
out["job_exit_codes"] = {c.name: int(c) for c in sky.exceptions.JobExitCode}
out["log_has_colours"] = "\x1b[" in log.getvalue()
print(json.dumps(out, default=str))
