"""Every call phalanx makes into SkyPilot's SDK, in one place (skypilot 0.14.1, client/server SDK).

The SDK talks to a SkyPilot API server (a local one is started by the SDK itself on first use,
``sky api start``; a remote one when ``sky api login`` set an endpoint). Calls return a request id
that ``sky.get`` (quietly) or ``sky.stream_and_get`` (copying the request's log) waits for, and
they raise, from there, the exception the server raised (``sky.exceptions``). Checked against the
real 0.14.1 library in ``tests/backends/skypilot/test_real_skypilot.py``; the facts here come from
its ``sky/client/sdk.py``, ``sky/jobs/client/sdk.py`` and ``sky/exceptions.py``:

- ``sky.launch(task, cluster_name, dryrun=, down=)`` -> request of ``(job_id, handle)``;
- ``sky.jobs.launch(task, name=)`` -> request of ``(job_ids, controller_handle)``;
- ``sky.tail_logs(cluster, job_id, follow, output_stream=)`` and ``sky.jobs.tail_logs(job_id=,
  follow=, output_stream=)`` block (no request id) and return a ``sky.exceptions.JobExitCode``
  (0 succeeded, 100 failed, 101 not finished, 102 not found, 103 cancelled), not the script's code;
- ``sky.job_status(cluster, job_ids=)`` -> request of ``{job_id: JobStatus or None}``;
  ``sky.jobs.queue_v2(refresh=, skip_finished=, job_ids=)`` -> request of ``(records, ...)``;
- ``sky.cancel(cluster, job_ids=)``, ``sky.down(cluster)``, ``sky.jobs.cancel(name=, job_ids=)``
  and ``sky.api_cancel(request_ids)`` -> requests of ``None``.

``sky`` is imported here only, inside functions (``phalanx ps`` never loads it).
"""

from __future__ import annotations

import contextlib
import copy
import io
import re
from typing import IO, Any

from ...errors import BackendError, MissingDependency, UsageError

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
CHECK_HINT = "set up a cloud's credentials and run `sky check` (https://docs.skypilot.co/en/latest/getting-started/installation.html)"


def sdk() -> Any:
    try:
        import sky
        # SkyPilot imports networkx lazily (sky/dag.py, in Dag()), so the launch thread would be the
        # first to. Once, in a test, that left networkx's registry half-filled and the next launch
        # failed with KeyError 'Algorithm already exists in dispatch namespace'; importing it here,
        # in the thread that imports sky (before any launch thread exists), takes that away.
        import networkx  # noqa: F401
    except ImportError:
        raise MissingDependency("skypilot", "skypilot") from None
    return sky


def one_line(exc: BaseException) -> str:
    """SkyPilot's messages carry terminal colours and line breaks; phalanx's errors are one line."""
    return " ".join(ANSI.sub("", str(exc)).split()) or type(exc).__name__


def load_task(sky: Any, config: dict[str, Any]) -> Any:
    """The task as SkyPilot reads it: its own schema and field parsing (accelerators, cpus, infra).
    Raises UsageError naming what SkyPilot refused."""
    try:
        return sky.Task.from_yaml_config(copy.deepcopy(config))  # it pops keys from what it is given
    except ValueError as exc:  # InvalidSkyPilotConfigError is a ValueError, as are the field parsers'
        raise UsageError(f"SkyPilot refuses the task: {one_line(exc)}",
                         "check --gpus/--cpus/--memory/--infra against `sky show-gpus` and SkyPilot's task YAML reference") from None


def with_secrets(task: Any, values: dict[str, str]) -> Any:
    """The task with the job's secret values in SkyPilot's own ``secrets`` (``Task.update_secrets``:
    set in the run step's environment on every VM, shown redacted by SkyPilot's dashboard and CLI);
    the task YAML phalanx plans and keeps never holds them."""
    if not values:
        return task
    if not hasattr(task, "update_secrets"):
        raise BackendError("this SkyPilot has no task secrets (Task.update_secrets, SkyPilot 0.10+)",
                           "upgrade SkyPilot (pip install 'phalanx[skypilot]'), or run without --secret")
    return task.update_secrets(dict(values))


def preflight(config: dict[str, Any], cluster: str) -> None:
    """What can be known before anything is created: the task parses, and SkyPilot's optimizer finds
    an enabled cloud offering its resources (``sky.launch(..., dryrun=True)``: provisions nothing).
    Raises UsageError (no cloud enabled, resources offered nowhere, bad task) or BackendError
    (the API server or SkyPilot's catalogue could not be reached)."""
    sky = sdk()
    # The staging directory is filled in by start; the dry run is about the resources.
    task = load_task(sky, {key: value for key, value in config.items() if key != "workdir"})
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # "Running on cluster: ..." is the SDK's chatter
            sky.get(sky.launch(task, cluster_name=cluster, dryrun=True, down=True))
    except sky.exceptions.NoCloudAccessError as exc:
        raise UsageError(f"SkyPilot has no cloud enabled ({one_line(exc)})", CHECK_HINT) from None
    except (sky.exceptions.ResourcesUnavailableError, sky.exceptions.ResourcesMismatchError) as exc:
        raise UsageError(f"no enabled cloud offers these resources: {one_line(exc)}",
                         "change --gpus/--infra/--instance-type (`sky show-gpus` lists what is offered), or enable another cloud (`sky check`)") from None
    except ValueError as exc:
        raise UsageError(f"SkyPilot refuses the task: {one_line(exc)}", "check the --gpus/--infra/... options") from None
    except sky.exceptions.ApiServerConnectionError as exc:
        raise BackendError(f"cannot reach SkyPilot's API server: {one_line(exc)}",
                           "start it with `sky api start`, or check `sky api info`") from None
    except Exception as exc:  # noqa: BLE001 - SkyPilot's other errors (catalogue download, cloud APIs) said in one line
        raise BackendError(f"SkyPilot could not check the task: {type(exc).__name__}: {one_line(exc)}",
                           "run `sky check`, then try again (--debug shows the traceback)") from None


class Plain(io.TextIOBase):
    """What SkyPilot streams (provisioning, the job's output), without its terminal colours, into
    a text file: the node's ``agent.log`` is read by ``phalanx logs`` and the dashboard."""

    def __init__(self, sink: IO[str]) -> None:
        self.sink = sink

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.sink.write(ANSI.sub("", text))
        return len(text)

    def flush(self) -> None:
        self.sink.flush()

    def close(self) -> None:
        if not self.closed:
            super().close()  # flushes, into the sink
            self.sink.close()


def start_launch(sky: Any, task: Any, cluster: str, managed: bool, down: bool = True) -> Any:
    """The launch request (not waited for): ``sky.jobs.launch`` with ``managed``, else ``sky.launch``
    (``down``: the cluster goes down when its job ends; not for a cluster the user named)."""
    if managed:
        return sky.jobs.launch(task, name=cluster)
    return sky.launch(task, cluster_name=cluster, down=down)


def wait_launch(sky: Any, request: Any, managed: bool, log: IO[str]) -> int | None:
    """The job id the launch request gives, once provisioned; its log goes to ``log``."""
    value = sky.stream_and_get(request, output_stream=log)
    if managed:
        job_ids, _controller = value
        return int(job_ids[0]) if job_ids else None
    job_id, _handle = value
    return None if job_id is None else int(job_id)


def tail(sky: Any, cluster: str, job_id: int | None, managed: bool, log: IO[str]) -> int | None:
    """Follows the job's output (all nodes) into ``log`` until it ends; SkyPilot's JobExitCode."""
    if managed:
        return sky.jobs.tail_logs(job_id=job_id, follow=True, output_stream=log)  # type: ignore[no-any-return]
    return sky.tail_logs(cluster, job_id, follow=True, output_stream=log)  # type: ignore[no-any-return]


def running(sky: Any, cluster: str, job_id: int, managed: bool) -> bool:
    """Whether the job has not ended yet (``sky.job_status`` for a cluster's job;
    ``sky.jobs.queue_v2(skip_finished=True)`` for a managed one: it lists unfinished jobs only).
    A cluster or jobs controller that is gone or down means it has ended."""
    try:
        if managed:
            records = sky.get(sky.jobs.queue_v2(refresh=False, skip_finished=True, job_ids=[job_id]))[0]
            return any(int(record["job_id"]) == job_id for record in records)
        status = sky.get(sky.job_status(cluster, job_ids=[job_id])).get(job_id)
        return status is not None and not status.is_terminal()
    except (sky.exceptions.ClusterDoesNotExist, sky.exceptions.ClusterNotUpError):
        return False


def outcome(sky: Any, code: int | None) -> tuple[str, bool]:
    """SkyPilot's JobExitCode as (its name, succeeded). ``None`` (nothing said) is not a success."""
    if code is None:
        return "no exit code", False
    try:
        name = sky.exceptions.JobExitCode(code).name
    except ValueError:
        name = f"exit code {code}"
    return name, code == 0


def stop(sky: Any, cluster: str, job_id: int | None, managed: bool, launching: Any = None, down: bool = True) -> None:
    """Cancels the job and frees its machines, waiting for each request: the launch request still
    provisioning (``sky.api_cancel``), the job (``sky.cancel`` / ``sky.jobs.cancel``) and, for a
    cluster phalanx made (``down``), ``sky.down``. A cluster that does not exist (never came up, or already down), or no
    managed job in progress, is done.
    Raises what else SkyPilot raised."""
    if launching is not None:
        sky.get(sky.api_cancel(launching, silent=True))
    if managed:
        try:
            sky.get(sky.jobs.cancel(job_ids=[job_id]) if job_id is not None else sky.jobs.cancel(name=cluster))
        except sky.exceptions.ClusterNotUpError:  # "No in-progress managed jobs": nothing left to cancel
            pass
        return
    try:
        if job_id is not None:
            sky.get(sky.cancel(cluster, job_ids=[job_id]))
        if down:
            sky.get(sky.down(cluster))
    except sky.exceptions.ClusterDoesNotExist:
        pass
