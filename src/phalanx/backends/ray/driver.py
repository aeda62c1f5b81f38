"""The phalanx driver, on the Ray cluster: ``python -m phalanx.backends.ray.driver``, the entrypoint
of one Ray job per attempt (submitted through the Jobs API, so it runs on without the machine that
submitted it). Its working directory is the job's Ray ``working_dir``: ``job.json`` (this attempt:
the node plans, resources, timeouts), ``code/`` (the code snapshot), ``state/`` (the state directory
to start from) and ``phalanx/`` itself, which is on ``PYTHONPATH`` for the driver and its actors.

What it does:

1. a STRICT_SPREAD placement group, one bundle per node (``CPU`` and the node's full ``GPU``
   count), waited for at most ``pending_timeout`` seconds; then it gives up, naming what it asked
   for and what the cluster has, and leaves nothing behind;
2. one :class:`NodeAgent` actor per bundle. Each reports its node (IP, Ray node id); node 0's IP
   is the rendezvous address, and every node agent gets the addresses in ``PHALANX_NODE_ADDRS``;
3. each actor runs the phalanx node agent (torchrun underneath, exactly as on SSH) in a session of
   its own and mirrors the node's files (rank logs, results, metrics; the state and output
   directories) as ``launch/remote.py``'s frames; the driver relays them on its stdout, which is the
   Ray job's log that the supervisor tails (:mod:`.relay` says how);
4. gang semantics: the first node that fails (a rank failed, or its Ray node died) gets the others
   SIGTERM, the grace period, then SIGKILL to their process groups. SIGTERM to the driver (``ray job
   stop``, i.e. ``phalanx stop``) does the same to every node. Ray itself only kills an actor's
   direct children, so the driver never relies on that.

A node lost with its Ray node (the raylet died) is reported as killed from outside (exit 137,
``stopped_by``), which the supervisor counts as a preemption: retried within ``--max-retries``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ...launch.netif import interface_for
from ...launch.procs import signal_group
from ...launch.frames import Mirror
from . import relay

MIN_RAY = (2, 10)  # placement groups and scheduling strategies as used here
POLL = 0.25  # seconds between drains of the actors' frames
KILL_MARGIN = 10.0  # seconds after the grace period before process groups get SIGKILL
EXIT_PENDING = 3  # the placement group could not be placed in time
EXIT_LOST = 128 + signal.SIGKILL  # a node died with its Ray node


class NodeAgent:
    """One node of the job, as a Ray actor (threaded: ``run`` blocks while ``drain`` and
    ``signal`` are called). Wrapped with ``ray.remote`` by the driver."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.lock = threading.Lock()
        self.agent: subprocess.Popen[bytes] | None = None

    # Mirror writes its frames here: the driver drains them.
    def write(self, data: bytes) -> int:
        with self.lock:
            self.buffer += data
        return len(data)

    def flush(self) -> None:
        pass

    def drain(self) -> bytes:
        with self.lock:
            data, self.buffer = bytes(self.buffer), bytearray()
        return data

    def where(self) -> dict[str, Any]:
        import ray

        return {"ip": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
                "hostname": socket.gethostname(), "pid": os.getpid(),
                "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def port_free(self, port: int) -> bool:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("", port))
                return True
            except OSError:
                return False

    def run(self, launch: dict[str, Any], trees: dict[str, str], addrs: list[str], source: str) -> int:
        """Run this node: its files laid out in this node's home, the node agent started in a
        session of its own, its files mirrored until it ends. Returns the node's exit code."""
        from ...core.contracts import LaunchFile, write_launch
        from ...core.paths import JobPaths

        launch_file, trees = LaunchFile.from_dict(_expanded(launch)), _expanded(trees)
        node = launch_file.node
        env = dict(node.env)
        if env.pop("PHALANX_AUTO_IFNAME", None):
            ifname = interface_for(addrs[0])
            if ifname:
                for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                    env.setdefault(key, ifname)
        node = dataclasses.replace(node, env=env)
        paths, attempt = JobPaths(Path(launch_file.job_dir)), launch_file.attempt
        _lay_out(Path(source), Path(node.cwd), Path(trees["state"]), Path(trees["output"]))
        if (Path(source) / "inputs").is_dir():  # --input, shipped in the working_dir
            shutil.copytree(Path(source) / "inputs", paths.shipped_input(""), dirs_exist_ok=True)
        launch_path = paths.node_launch(attempt, node.node_rank)
        launch_path.parent.mkdir(parents=True, exist_ok=True)
        write_launch(launch_path, dataclasses.replace(launch_file, node=node))
        mirror = Mirror(paths.attempt(attempt), node.node_rank, self, {k: Path(v) for k, v in trees.items()})  # type: ignore[arg-type]
        with open(paths.agent_log(attempt, node.node_rank), "ab") as log:
            self.agent = subprocess.Popen(
                [sys.executable, "-m", "phalanx.launch.agent", "--launch", str(launch_path)],
                env={**os.environ, "PHALANX_NODE_ADDRS": ",".join(addrs)}, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, cwd=node.cwd, start_new_session=True,
            )
        while self.agent.poll() is None:
            mirror.scan()
            time.sleep(0.2)
        code = self.agent.returncode
        code = 128 - code if code < 0 else code
        _name_node(paths.node_result(attempt, node.node_rank))
        mirror.scan(final=True)  # everything the node wrote goes before its exit code
        mirror.frame({"exit": code})
        return code

    def signal(self, signum: int) -> None:
        """Signal the agent's whole process group (the agent leads its own session)."""
        if self.agent is not None and self.agent.poll() is None:
            signal_group(self.agent.pid, signum)


def _name_node(result_path: Path) -> None:
    """Say in the node's result which Ray node it ran on: the root cause names it."""
    import ray

    from ...core.contracts import read_node_result, write_node_result
    from ...errors import ContractError

    try:
        result = read_node_result(result_path)
    except ContractError:
        return  # the agent's report stays as it is; the supervisor says what is wrong with it
    if result is not None:
        node_id = ray.get_runtime_context().get_node_id()
        write_node_result(result_path, dataclasses.replace(
            result, host=f"{ray.util.get_node_ip_address()} (Ray node {node_id[:12]})",
            details={**result.details, "ray_node_id": node_id}))


def _expanded(data: Any) -> Any:
    """``data`` with paths starting ``~/`` in this node's home (the planner does not know it)."""
    home = os.path.expanduser("~")
    return json.loads(json.dumps(data).replace('"~/', json.dumps(home + "/")[:-1])
                      .replace(json.dumps(relay.PYTHON)[1:-1], json.dumps(sys.executable)[1:-1]))


def _lay_out(source: Path, code_dir: Path, state_dir: Path, output_dir: Path) -> None:
    """This node's copy of the code, and the state directory exactly as submitted (a stale one
    from an older run of this name on this node must not win)."""
    if (source / "code").is_dir():
        shutil.copytree(source / "code", code_dir, dirs_exist_ok=True)
    code_dir.mkdir(parents=True, exist_ok=True)
    incoming = state_dir.with_name(f".{state_dir.name}.incoming-{os.getpid()}")
    shutil.rmtree(incoming, ignore_errors=True)
    if (source / "state").is_dir():
        shutil.copytree(source / "state", incoming)
    else:
        incoming.mkdir(parents=True)
    shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    os.replace(incoming, state_dir)
    output_dir.mkdir(parents=True, exist_ok=True)


class Driver:
    """One attempt on the cluster, from placement group to the last node's end."""

    def __init__(self, job: dict[str, Any], out: Any = None) -> None:
        self.job = job
        self.out = out or sys.stdout
        self.stop_signal: int | None = None
        self.deadline: float | None = None  # SIGKILL to every process group then
        self.killed = False
        self.codes: dict[int, int] = {}
        self.live: dict[int, Any] = {}  # node rank -> actor, while its node runs

    def say(self, event: dict[str, Any]) -> None:
        self.out.write(relay.event_line(event))
        self.out.flush()

    def relay(self, node: int, data: bytes) -> None:
        for line in relay.data_lines(node, data):
            self.out.write(line)
        self.out.flush()

    def request_stop(self, signum: int) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum

    def run(self) -> int:
        import ray

        version = tuple(int(p) for p in ray.__version__.split(".")[:2] if p.isdigit())
        if version < MIN_RAY:
            self.say({"error": f"the cluster runs Ray {ray.__version__}; the phalanx driver needs Ray "
                               f"{'.'.join(map(str, MIN_RAY))} or newer"})
            return 2
        ray.init(log_to_driver=False)  # the address comes from the Jobs API (RAY_ADDRESS)
        from ray.util.placement_group import placement_group, remove_placement_group

        nnodes = len(self.job["nodes"])
        gpus = self.job["gpus"] if self.job.get("gpus") is not None else _largest_gpu_count(ray.nodes())
        bundle = {"CPU": float(self.job["cpus"]), **({"GPU": float(gpus)} if gpus else {})}
        pg = placement_group([dict(bundle) for _ in range(nnodes)], strategy="STRICT_SPREAD",
                             name=f"phalanx-{self.job['job_id']}-{self.job['attempt']}")
        self.say({"pending": {"bundle": bundle, "nodes": nnodes}})
        try:
            if not self._placed(pg):
                if self.stop_signal is not None:
                    return 128 + self.stop_signal
                self.say({"error": _unplaced(ray, bundle, nnodes, float(self.job["pending_timeout"]))})
                return EXIT_PENDING
            return self._run_nodes(ray, pg, bundle)
        finally:
            remove_placement_group(pg)

    def _placed(self, pg: Any) -> bool:
        import ray

        ready = pg.ready()
        deadline = time.monotonic() + float(self.job["pending_timeout"])
        while time.monotonic() < deadline and self.stop_signal is None:
            done, _ = ray.wait([ready], timeout=0.5)
            if done:
                return True
        return False

    def _run_nodes(self, ray: Any, pg: Any, bundle: dict[str, float]) -> int:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        agent_cls = ray.remote(NodeAgent)
        actors = [
            agent_cls.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
                num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), max_concurrency=4, max_restarts=0,
                name=f"phalanx-{self.job['job_id']}-{self.job['attempt']}-node{i}",
            ).remote()
            for i in range(len(self.job["nodes"]))
        ]
        places = ray.get([a.where.remote() for a in actors])
        self.say({"placed": places})
        if not ray.get(actors[0].port_free.remote(int(self.job["master_port"]))):
            self.say({"error": f"the rendezvous port {self.job['master_port']} is in use on node 0 ({places[0]['ip']})"})
            return 1
        addrs = [p["ip"] for p in places]
        source = os.getcwd()
        runs = {actors[i].run.remote(launch, self.job["trees"], addrs, source): i
                for i, launch in enumerate(self.job["nodes"])}
        live = self.live = dict(enumerate(actors))
        while runs:
            self._drain(ray, live)
            done, _ = ray.wait(list(runs), timeout=POLL)
            for ref in done:
                node = runs.pop(ref)
                self._finished(ray, node, ref, live.pop(node), places[node])
            self._escalate(ray, live)
        failed = [c for c in self.codes.values() if c]
        return (128 + self.stop_signal) if self.stop_signal else (failed[0] if failed else 0)

    def _drain(self, ray: Any, live: dict[int, Any]) -> None:
        refs = {live[n].drain.remote(): n for n in live}
        for ref, node in refs.items():
            try:
                data = ray.get(ref, timeout=30)
            except Exception:  # noqa: BLE001 - a dead actor: its run() says why
                continue
            if data:
                self.relay(node, data)

    def _finished(self, ray: Any, node: int, ref: Any, actor: Any, place: dict[str, Any]) -> None:
        try:
            code = int(ray.get(ref))
            try:
                self.relay(node, ray.get(actor.drain.remote(), timeout=30))
            except Exception:  # noqa: BLE001 - the node is gone right after it ended
                pass
        except Exception as exc:  # noqa: BLE001 - the actor died: its Ray node is lost
            code = EXIT_LOST
            message = (f"Ray node {place['node_id']} ({place['ip']}) of node {node} was lost: "
                       f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            self.say({"lost": {"node": node, **place, "message": message}})
            self.relay(node, relay.lost_frames(node, place, message, self.job["attempt"]))
        self.codes[node] = code
        self.out.write(relay.end_line(node))
        self.out.flush()
        if code and self.stop_signal is None and self.deadline is None:
            self.deadline = time.monotonic() + float(self.job["grace"]) + KILL_MARGIN  # gang: stop the rest
            self._signal_all(ray, signal.SIGTERM)

    def _escalate(self, ray: Any, live: dict[int, Any]) -> None:
        if self.stop_signal is not None and self.deadline is None:
            self.deadline = time.monotonic() + float(self.job["grace"]) + KILL_MARGIN
            self._signal_all(ray, self.stop_signal)
        if self.deadline is not None and time.monotonic() > self.deadline and not self.killed:
            self.killed = True
            self._signal_all(ray, signal.SIGKILL)

    def _signal_all(self, ray: Any, signum: int) -> None:
        for actor in self.live.values():
            actor.signal.remote(int(signum))


def _largest_gpu_count(nodes: list[dict[str, Any]]) -> int:
    return max([int(n.get("Resources", {}).get("GPU", 0)) for n in nodes if n.get("Alive")] or [0])


def _unplaced(ray: Any, bundle: dict[str, float], nnodes: int, waited: float) -> str:
    """Why the placement group is still pending: what one node of the job needs, what each
    alive Ray node has (total, and free now)."""
    try:
        available = ray.available_resources()
    except Exception:  # noqa: BLE001 - the message goes out without it
        available = {}
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    fit = [n for n in nodes if all(n.get("Resources", {}).get(k, 0) >= v for k, v in bundle.items())]
    have = "; ".join(f"{n['NodeManagerAddress']} " + ", ".join(f"{k} {v:g}" for k, v in sorted(n["Resources"].items())
                                                                 if k in ("CPU", "GPU"))
                     for n in nodes)
    free = ", ".join(f"{k} {available.get(k, 0):g}" for k in sorted(bundle))
    return (f"the job's {nnodes} node(s) (each {', '.join(f'{k} {v:g}' for k, v in bundle.items())}, one per Ray node) "
            f"could not be placed within {waited:g}s: {len(fit)} of the cluster's {len(nodes)} alive node(s) can hold "
            f"one (nodes: {have}; free now: {free})")


def main() -> None:
    job = json.loads(Path("job.json").read_text())
    driver = Driver(job)

    def stop(signum: int, frame: Any) -> None:
        driver.request_stop(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    code = driver.run()
    sys.stdout.flush()
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main()
