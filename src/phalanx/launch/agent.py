"""The node agent: runs one node's part of a job. ``python -m phalanx.launch.agent --launch FILE``.

FILE (``node_<n>/launch.json``) holds the node's plan. The agent either hands the node to
torch's own elastic agent (``torch.distributed.run``: rendezvous, worker supervision,
in-place restarts) or, when no torchrun is needed, starts the processes itself. Either way:

- it dies with its parent (the supervisor) and takes its workers down with it;
- SIGTERM/SIGINT/SIGHUP/SIGUSR1 are forwarded to every worker, which gets the grace period
  to exit before SIGKILL;
- it writes ``node_<n>/result.json``: the node's exit code and per-rank failures;
- it exits with the node's exit code (128+N for a signal).

Under a scheduler that starts the same command on every node (``srun``), ``--node-rank-from
SLURM_NODEID`` picks this node's launch file (``{node_rank}`` in the ``--launch`` path), and the
node addresses the scheduler chose arrive in ``PHALANX_NODE_ADDRS`` (see ``plan.bind_addresses``).

With ``--control FD`` (the local backend) the agent is *kept*: after an attempt it reports its end
on that line and waits for the supervisor to name the next attempt's launch file, which it runs
in this same process, with torch already imported: a retry then costs what torchrun's in-place
restart costs, with a fresh rendezvous (the new plan's port and store) and new workers. The
supervisor decides every retry; the line ending lets the agent go (``launch/control.py``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, NoReturn

from ..core.contracts import LaunchFile, NodeResult, read_launch, write_node_result
from ..core.paths import JobPaths
from ..core.plan import NodePlan, bind_addresses
from ..errors import ContractError
from . import rendezvous, trace
from .control import AgentLine
from .exits import add_unnoticed_raises, died_at, end_strays, failure_of, interrupted_code, rank_exits
from .nodecheck import check_node, unchecked_result
from .procs import STOP_SIGNALS, ChildWatcher, die_with_parent, exit_code, signal_group, signal_name, wait_until
from .rendezvous import tuned, wait_for_host
from .workers import KINDS, Standbys, WorkerSource, supplied


def run_torchrun(node: NodePlan, paths: JobPaths, attempt: int, grace: float | None = None,
                 watcher: ChildWatcher | None = None, source: WorkerSource | None = None) -> dict[str, Any]:
    """Run the node through torch's elastic agent, in this process (no extra interpreter).
    A stop signal reaches torch's agent, which passes it on to the workers and waits
    ``grace`` seconds (torch's own default: 30) before SIGKILL.

    ``watcher``: a kept agent's (more attempts follow in this process). torch's signal handlers
    then live only while it runs, and a stop signal that comes before torch installs them (during
    the rendezvous), or that the watcher holds already, stops the attempt too. ``source``: workers
    prepared ahead, taken before starting new ones (``launch/workers.py``)."""
    try:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import elastic_launch
        from torch.distributed.run import config_from_args, parse_args
    except ImportError:
        print("phalanx: torch is not installed on this node; install it with: pip install 'phalanx[torch]'", file=sys.stderr)
        return {"exitcode": 1, "failures": [], "error": "torch is not installed"}
    assert node.torchrun_argv is not None
    config, cmd, cmd_args = config_from_args(parse_args([*node.torchrun_argv, *node.worker_argv]))
    if grace is not None and hasattr(config, "shutdown_timeout"):  # LaunchConfig has it since torch 2.6
        config.shutdown_timeout = max(1, int(grace))
    saved = _stops_raise(SignalException, config.signals_to_handle) if watcher is not None else None
    try:
        try:
            if watcher is not None and watcher.stop_requests:
                signum = signal.Signals(watcher.stop_requests[0])
                raise SignalException(f"stopped by {signum.name} before it started", signum)
            if config.rdzv_backend == "c10d" and str(config.rdzv_configs.get("is_host", "")).lower() in ("false", "0"):
                wait_for_host(config.rdzv_endpoint)  # node 0's new store: no connect before it listens
            log = str(paths.agent_log(attempt, node.node_rank))
            with supplied(source, log), tuned(config.max_nodes, close_behind=watcher is not None):
                elastic_launch(config, cmd)(*cmd_args)
        finally:
            if saved is not None:
                _restore_handlers(saved)
    except ChildFailedError as err:
        failures: list[dict[str, Any]] = [
            {
                "rank": rank,
                "local_rank": f.local_rank,
                "pid": f.pid,
                "exitcode": exit_code(f.exitcode),
                "signal": signal_name(f.exitcode),
                # torch's timestamp is whole seconds: the failure came before the next one.
                "timestamp": died_at(paths, attempt, rank, float(f.timestamp) + 1),
            }
            for rank, f in sorted(err.failures.items())
        ]
        # torchrun SIGTERMs the surviving workers after the first failure; those are
        # casualties, not causes, as long as some rank failed on its own.
        own = [f for f in failures if f["signal"] != "SIGTERM"]
        if own:
            for f in failures:
                f["terminated"] = f not in own
        first = min(own or failures, key=lambda f: f["timestamp"])
        return {"exitcode": first["exitcode"] or 1, "failures": [f for f in failures if not f.get("terminated")],
                "terminated": [f["rank"] for f in failures if f.get("terminated")]}
    except SignalException as sig:
        # torch forwarded the signal to the workers and waited for them (``grace``, then SIGKILL).
        # A kept agent stopped before torch started any worker has no ranks: the signal's status.
        ranks = rank_exits(paths, attempt, node.node_rank, 128 + int(sig.sigval))
        interrupted = sig.sigval == signal.SIGINT and ranks
        return {"exitcode": interrupted_code(ranks) if interrupted else 128 + int(sig.sigval),
                "failures": [], "ranks": ranks, "stopped_by": signal.Signals(sig.sigval).name}
    return {"exitcode": 0, "failures": []}


def run_direct(node: NodePlan, grace: float, paths: JobPaths, attempt: int,
               watcher: ChildWatcher | None = None, source: WorkerSource | None = None) -> dict[str, Any]:
    """Start the node's processes ourselves; fail fast when one fails; forward stop signals.
    ``watcher``: a kept agent's own (a stop request it holds stops this attempt); ``source``:
    workers prepared ahead, taken before starting new ones."""
    with ExitStack() as stack:
        if watcher is None:
            watcher = stack.enter_context(ChildWatcher())
        if watcher.stop_requests:  # a kept agent was stopped between being told to run and running
            signum = watcher.stop_requests[0]
            return {"exitcode": 128 + signum, "failures": [], "stopped_by": signal.Signals(signum).name}
        procs: dict[int, subprocess.Popen[bytes]] = {}
        log = str(paths.agent_log(attempt, node.node_rank))
        for p in node.processes:
            env = {**os.environ, **p.env}
            ready = source.take(p.argv, env, log) if source is not None else None
            procs[p.rank] = ready or subprocess.Popen(list(p.argv), env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        failures: list[dict[str, Any]] = []
        stopped_by: int | None = None

        def all_done() -> bool:
            return all(pr.poll() is not None for pr in procs.values())

        while True:
            for rank, pr in procs.items():
                code = pr.poll()
                if code not in (None, 0) and not any(f["rank"] == rank for f in failures):
                    failures.append(failure_of(rank, pr, paths, attempt))
            if failures or all_done() or watcher.stop_requests:
                break
            watcher.wait(1.0)
        failures = _not_stopped(failures, watcher)
        if watcher.stop_requests and not failures:
            stopped_by = watcher.stop_requests[0]

        if not all_done():
            # Fail fast (or stop): the rest of the node gets SIGTERM and the grace period.
            signum = stopped_by or signal.SIGTERM
            for pr in procs.values():
                if pr.poll() is None:
                    signal_group(pr.pid, signum)
            if not _wait_forwarding(all_done, procs, watcher, time.monotonic() + grace):
                for pr in procs.values():
                    signal_group(pr.pid, signal.SIGKILL)
                wait_until(all_done, watcher, time.monotonic() + 10)
        ranks = {str(r): {"pid": pr.pid, "exitcode": exit_code(pr.returncode if pr.returncode is not None else -9)} for r, pr in procs.items()}
    if stopped_by == signal.SIGINT:  # Ctrl-C: the outcome is the scripts'
        return {"exitcode": interrupted_code(ranks), "failures": [], "ranks": ranks, "stopped_by": "SIGINT"}
    if stopped_by is not None:
        return {"exitcode": 128 + stopped_by, "failures": [], "ranks": ranks, "stopped_by": signal.Signals(stopped_by).name}
    if failures:
        return {"exitcode": min(failures, key=lambda f: f["timestamp"])["exitcode"], "failures": failures, "ranks": ranks}
    return {"exitcode": 0, "failures": [], "ranks": ranks}


def _wait_forwarding(done: Callable[[], bool], procs: dict[int, subprocess.Popen[bytes]], watcher: ChildWatcher,
                     deadline: float) -> bool:
    """``wait_until``, passing each further stop signal on to the ranks still running (after
    a Ctrl-C's SIGINT, the supervisor escalates with SIGTERM)."""
    seen = len(watcher.stop_requests)
    while not done() and time.monotonic() < deadline:
        watcher.wait(min(deadline - time.monotonic(), 0.5))
        for signum in watcher.stop_requests[seen:]:
            for pr in procs.values():
                if pr.poll() is None:
                    signal_group(pr.pid, signum)
        seen = len(watcher.stop_requests)
    return done()


def _not_stopped(failures: list[dict[str, Any]], watcher: ChildWatcher) -> list[dict[str, Any]]:
    """The failures that are not this node's stop. A scheduler (SLURM's time limit, a
    preemption) signals every process of the node at once: a rank may die of that SIGTERM before
    this agent hears its own copy. A moment is given for that copy; ranks that died of the signal
    the agent got were stopped with it, not broken."""
    stop_names = {signal.Signals(s).name for s in STOP_SIGNALS}
    if not failures or not all(f["signal"] in stop_names for f in failures):
        return failures
    wait_until(lambda: bool(watcher.stop_requests), watcher, time.monotonic() + 1.0)
    got = {signal.Signals(s).name for s in watcher.stop_requests}
    return [f for f in failures if f["signal"] not in got]


def _start_sampler(paths: JobPaths, attempt: int, node_rank: int, interval: float) -> Any:
    """This node's resource samples (CPU, RAM, I/O, GPUs; per rank process tree)."""
    try:
        from ..monitor.resources import ResourceSampler, rank_pids
    except ImportError:  # psutil missing on a remote node: run without samples
        return None
    from ..health.straggler_probe import StateProbe

    def pids() -> dict[int, int]:
        return rank_pids(paths, attempt, node_rank)

    return ResourceSampler(paths.node_resources(attempt, node_rank), node_rank, pids, interval, StateProbe(pids)).start()


def _load(launch: str, node_rank_from: str | None) -> tuple[NodePlan, LaunchFile]:
    """This node's plan, with the addresses known only now filled in. Exits 2 when it cannot."""

    def fail(message: str) -> NoReturn:
        print(f"phalanx agent: {message}", file=sys.stderr, flush=True)
        raise SystemExit(2)

    if node_rank_from:
        rank = os.environ.get(node_rank_from, "")
        if not rank.isdigit():
            fail(f"--node-rank-from {node_rank_from}: the variable holds {rank!r}, not a node rank")
        launch = launch.replace("{node_rank}", rank)
    try:
        data = read_launch(Path(launch))
    except ContractError as exc:
        fail(str(exc))
    if data is None:
        fail(f"cannot read {launch}")
    addrs = [a for a in os.environ.get("PHALANX_NODE_ADDRS", "").split(",") if a]
    try:
        return bind_addresses(data.node, addrs), data
    except ValueError as exc:
        fail(f"{exc} (PHALANX_NODE_ADDRS={os.environ.get('PHALANX_NODE_ADDRS', '')!r})")


def run_node(node: NodePlan, data: LaunchFile, watcher: ChildWatcher | None = None,
             source: WorkerSource | None = None, node_name_from: str | None = None) -> NodeResult:
    """Run one attempt of this node to its end and write its ``result.json``. ``watcher`` and
    ``source``: set by a kept agent (more attempts follow in this process; workers ready ahead).
    ``node_name_from``: the variable naming this node as its scheduler does, kept in the result."""
    paths = JobPaths(Path(data.job_dir))
    attempt = data.attempt
    started = time.time()
    checked = check_node(node, watcher)
    if checked is not None and not checked.ok:  # no rank starts on a node that failed its check
        result = unchecked_result(checked)
    else:
        sampler = _start_sampler(paths, attempt, node.node_rank, data.sample_interval)
        steps = trace.follow_torch(paths, attempt=attempt, node=node.node_rank)
        try:
            if node.torchrun_argv is not None:
                result = run_torchrun(node, paths, attempt, data.grace, watcher, source)
            else:
                result = run_direct(node, data.grace, paths, attempt, watcher, source)
            # No orphans: what the ranks left running ends with them (launch/strays.py).
            result["strays"] = end_strays(paths, attempt, node.node_rank, node.env.get("PHALANX_JOB_ID", ""),
                                          data.grace, watcher)
        finally:
            trace.unfollow(steps)
            if sampler is not None:
                sampler.stop()
        add_unnoticed_raises(result, paths, attempt, node.node_rank)
        if checked is not None:
            result["health"] = checked.to_dict()
    trace.mark(paths, "agent", "ended", attempt=attempt, node=node.node_rank)
    if node_name_from and os.environ.get(node_name_from):
        result["node_name"] = os.environ[node_name_from]  # as the scheduler names it (SLURM --exclude)
    result.update(node_rank=node.node_rank, host=node.host, started=started, finished=time.time(), agent_pid=os.getpid())
    report = NodeResult.from_dict(result, f"node {node.node_rank}'s result")
    write_node_result(paths.node_result(attempt, node.node_rank), report)
    return report


def serve(control: int, launch: str, node_rank_from: str | None) -> NoReturn:
    """A kept agent: run attempt after attempt as the supervisor names them on the ``control``
    line, until the line ends (or a stop signal comes between attempts)."""
    line = AgentLine(control)
    base_env = dict(os.environ)
    secrets: dict[str, str] = {}  # a later attempt's secret values, from the line (the first's: base_env)
    standbys = Standbys()
    code = 0
    with ChildWatcher() as watcher:
        while True:
            node, data = _load(launch, node_rank_from)
            paths = JobPaths(Path(data.job_dir))
            trace.mark(paths, "agent", "launching", attempt=data.attempt, node=node.node_rank, pid=os.getpid())
            os.environ.clear()  # this attempt's variables only, none left from the one before
            os.environ.update(base_env)
            os.environ.update(node.env)
            os.environ.update(secrets)
            report = run_node(node, data, watcher, standbys)
            standbys.close()  # what this attempt did not take
            # Stops that came during the attempt stopped it; one that comes from now on ends the agent.
            watcher.stop_requests.clear()
            line.ended(data.attempt, report.exitcode)
            trace.mark(paths, "agent", "reported", attempt=data.attempt, node=node.node_rank)
            if report.exitcode != 0 and report.stopped_by != "SIGINT":
                # Failed, or stopped because another node failed: the supervisor may retry (never
                # after a Ctrl-C). The next attempt's interpreters start now, while it decides and
                # the new rendezvous runs; unused, they go when the agent does.
                count, kind = _local_workers(node)
                if count:
                    standbys.prepare(count, kind)
            sys.stdout.flush()
            sys.stderr.flush()
            following = line.next(watcher)
            if following is None:
                code = 128 + watcher.stop_requests[0] if watcher.stop_requests else 0
                break
            launch, log, secrets = following
            _log_to(log)
    standbys.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _local_workers(node: NodePlan) -> tuple[int, str]:
    """How many workers this node starts, and of which kind a standby must be to become one:
    "cold" (the bootstrap) or "warm" (a warm plan's workers are the warm pool's stand-ins);
    (0, "") for workers no standby becomes (a command, another interpreter's)."""
    if node.torchrun_argv is None:
        kinds = [k for p in node.processes for k, (program, _) in KINDS.items() if tuple(p.argv[1:4]) == program]
        return (len(kinds), kinds[0]) if kinds and len(set(kinds)) == 1 else (0, "")
    module = node.torchrun_argv[-1] if node.torchrun_argv[-2:-1] == ("--module",) else ""
    kind = next((k for k, (program, _) in KINDS.items() if program[-1] == module), "")
    for arg in node.torchrun_argv:
        if arg.startswith("--nproc-per-node="):
            value = arg.split("=", 1)[1]
            return (int(value), kind) if value.isdigit() and kind else (0, "")
    return 0, ""


def _log_to(log: str) -> None:
    """This process's stdout and stderr (and so torch's messages) into ``log`` from now on."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _stops_raise(exception: type[BaseException], torch_signals: str) -> dict[int, Any]:
    """Until ``_restore_handlers``: a stop signal raises torch's ``SignalException`` (what
    torch's own handler does once it starts workers), so it also stops a rendezvous. Returns the
    handlers to restore, of every signal torch may take over."""
    names = {signal.Signals(s).name for s in STOP_SIGNALS} | {n.strip() for n in torch_signals.split(",") if n.strip()}
    signums = [getattr(signal, n) for n in names if hasattr(signal, n)]
    saved = {int(s): signal.getsignal(s) for s in signums}

    def stop(signum: int, _frame: object) -> None:
        raise exception(f"Process {os.getpid()} got signal: {signum}", signal.Signals(signum))  # type: ignore[call-arg]

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    return saved


def _restore_handlers(saved: dict[int, Any]) -> None:
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m phalanx.launch.agent")
    parser.add_argument("--launch", required=True, help="the node's launch.json")
    parser.add_argument("--node-rank-from", metavar="VAR",
                        help="environment variable holding this node's rank, filled into {node_rank} of --launch")
    parser.add_argument("--node-name-from", metavar="VAR",
                        help="environment variable naming this node as its scheduler does (kept in result.json)")
    parser.add_argument("--rdzv-wait", type=float, metavar="SECONDS",
                        help="how long a node other than node 0 waits for node 0's rendezvous to listen (default 10)")
    parser.add_argument("--control", type=int, metavar="FD",
                        help="a line to the supervisor: keep running the attempts it names (launch/control.py)")
    args = parser.parse_args(argv)
    if args.rdzv_wait is not None:
        rendezvous.HOST_WAIT_S = args.rdzv_wait
    # SIGTERM, not SIGKILL: our workers then get their grace period too.
    die_with_parent(signal.SIGTERM)
    if args.control is not None:
        serve(args.control, args.launch, args.node_rank_from)
    node, data = _load(args.launch, args.node_rank_from)
    os.environ.update(node.env)
    report = run_node(node, data, node_name_from=args.node_name_from)
    sys.stdout.flush()
    os._exit(report.exitcode & 0xFF)


if __name__ == "__main__":
    main()
