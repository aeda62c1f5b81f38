"""What the script will see, in words: the notes ``--dry-run`` prints above a plan, and the
warnings said at submit.

One line each: how the processes start (as python, or with torchrun's variables) and which
framework contract they get (``TF_CONFIG``, JAX initialized by phalanx or by the program), whether
``{node_rank}``-style arguments are filled in (when the arguments hold one), the working
directory and what relative paths mean there, which code is frozen and which is read live,
the state directory (the job's own or shared by name), the framework when it was inferred;
and a warning per script argument that is a relative path the job will not find (a host that
got a shipped copy of the code). Reads the script's imports and, for shipped copies, lists
the code root; starts nothing.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from ..core.env import fills_templates, initializes_jax, runs_as_python
from ..core.arguments import has_template
from ..core.spec import EntrypointKind, Framework, JobSpec, Spawn, code_root
from .imports import infer_framework, module_file
from ..core.plan import Plan

WARNING = "warning: "


def infer(spec: JobSpec) -> tuple[str, str] | None:
    """For a multi-node torch (default) job: ``(framework, one line)`` when the script's imports
    name JAX or TensorFlow and not torch; None otherwise."""
    if spec.resources.nnodes <= 1 or spec.framework is not Framework.TORCH:
        return None
    entry = spec.entrypoint
    if entry.kind is EntrypointKind.SCRIPT:
        path: str | None = entry.target
    elif entry.kind is EntrypointKind.MODULE:
        path = module_file(entry.target, spec.workdir)
    else:
        return None
    found = infer_framework(path) if path else None
    if found is None:
        return None
    framework, why = found
    name = entry.typed or os.path.basename(entry.target) if entry.kind is EntrypointKind.SCRIPT else f"-m {entry.target}"
    return framework, f"framework: {framework}, inferred from {name} ({why}); --framework torch|tf|jax chooses"


def annotate(plan: Plan, spec: JobSpec, shared: bool, home: Path) -> Plan:
    """``plan`` with its notes: ``spec`` as submitted, ``shared`` whether the nodes see this
    machine's files at the same paths."""
    lines = [_processes(spec), _arguments(spec), _cwd(spec, plan, shared), _code(spec, plan, shared, home),
             _state(spec, plan)]
    framework = _framework(spec)
    if framework:
        lines.append(framework)
    if not shared:
        lines += [WARNING + w for w in relative_path_warnings(spec, plan.nodes[0].cwd if plan.nodes else "", home)]
    return replace(plan, notes=tuple(line for line in lines if line))


def warnings(plan: Plan) -> list[str]:
    """The notes to say at submit, not only in --dry-run."""
    return [note for note in plan.notes if note.startswith(WARNING)]


def _processes(spec: JobSpec) -> str:
    res = spec.resources
    if runs_as_python(spec):
        line = ("process: one, started as python starts it: no launcher variables (RANK, LOCAL_RANK, WORLD_SIZE, "
                "MASTER_ADDR, ...), so a script that starts its own workers can; -n 1 gives torchrun's")
        if spec.framework is Framework.TF:
            line += ("; --framework tf adds a one-worker TF_CONFIG (worker 0, the chief), as SageMaker gives a "
                     "one-instance MultiWorkerMirroredStrategy job")
        return line
    if spec.spawn is Spawn.SELF:
        return (f"processes: one per node ({res.nnodes}), which starts its own workers and connects them itself "
                "(phalanx initializes nothing); torchrun's variables as torchrun --nproc-per-node 1 sets them "
                "(RANK = node rank, WORLD_SIZE = nodes)")
    extra = {Framework.JAX: ", JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID",
             Framework.TF: ", TF_CONFIG (worker 0 the chief)"}.get(spec.framework, "")
    if initializes_jax(spec):
        extra += ("; phalanx calls jax.distributed.initialize before the script: a later call for the same "
                  "processes (the script's or a library's) is a no-op, one for others gets JAX's own error")
    if res.world_size == 1:
        return f"process: one, with torchrun's variables (-n 1 given: like torchrun --nproc-per-node 1){extra}"
    return f"processes: {res.nnodes} node(s) x {res.nproc_per_node}, each with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, ...){extra}"


def _arguments(spec: JobSpec) -> str | None:
    if not has_template(spec.entrypoint.args):
        return None
    if fills_templates(spec):
        why = "--spawn self" if spec.spawn is Spawn.SELF else "a topology was given"
        return ("arguments: {node_rank} {num_nodes} {nproc_per_node} {master_addr} {master_port} {job_id} "
                f"{{state_dir}} {{output_dir}} are filled in per node ({why}); {{{{node_rank}}}} passes a literal {{node_rank}}")
    return ("arguments: as typed, {node_rank}-style text included (one plain process gets them as python would); "
            "-n, --nnodes or --spawn self fill them in per node")


def _cwd(spec: JobSpec, plan: Plan, shared: bool) -> str:
    cwd = plan.nodes[0].cwd if plan.nodes else spec.workdir
    if not shared:
        return (f"cwd on the hosts: {cwd}, the shipped copy of {code_root(spec)} (no shared filesystem): relative "
                "paths resolve inside it, where only the snapshot's files are; files written there stay on the host "
                "(write results to PHALANX_OUTPUT_DIR or PHALANX_STATE_DIR)")
    where = "" if plan.backend == "local" else " (the same path on the nodes: a shared filesystem)"
    return f"cwd: {cwd}{where}: relative paths and files written to cwd behave as under python"


def _code(spec: JobSpec, plan: Plan, shared: bool, home: Path) -> str:
    root = code_root(spec)
    if spec.entrypoint.kind is EntrypointKind.COMMAND:
        return ("code: a command runs as given and reads its files live (only a Python script or -m module "
                "that phalanx starts is frozen)")
    if not shared:
        return f"code: the copy of {root} shipped to each host runs, as it was at submit"
    code_dir = spec.code_dir or (str(home / "jobs" / plan.job_id / "code") if spec.snapshot else "")
    if not code_dir:
        return f"code: read live from {root} (no snapshot): a retry or resume runs the files as they are then"
    return (f"code: frozen at submit in {code_dir}, a copy of {root}: the script and the Python modules it imports "
            f"from there run as submitted (retries, resumes, queued trials too), under their names in {root} "
            "(__file__, tracebacks, logs); data and other files opened by path are read live")


def _state(spec: JobSpec, plan: Plan) -> str:
    state = plan.nodes[0].env.get("PHALANX_STATE_DIR", "") if plan.nodes else ""
    if spec.state_key == f"{spec.name}-{plan.job_id}":
        return f"state: PHALANX_STATE_DIR={state}, this job's own: a later run starts empty (--name NAME shares one across runs)"
    if spec.state_uri and spec.state_name != spec.name:
        return f"state: PHALANX_STATE_DIR={state}, restored from {spec.state_uri} before start (--clean-state starts over)"
    return (f"state: PHALANX_STATE_DIR={state}, shared by every run named '{spec.state_key}': it starts with what "
            "earlier runs left there (--clean-state starts over)")


def _framework(spec: JobSpec) -> str | None:
    if spec.resources.nnodes <= 1 or spec.framework is Framework.TORCH:
        return None
    found = infer(spec.with_(framework=Framework.TORCH))
    if found is None or found[0] != spec.framework.value:
        return None
    return found[1]


def relative_path_warnings(spec: JobSpec, remote_cwd: str, home: Path) -> list[str]:
    """A line per script argument that is a relative path existing here but not in the shipped
    copy of the code the hosts run in (``../data``, data the snapshot leaves out). Pure but for
    listing the code root."""
    from ..storage.snapshot import list_workdir

    root = code_root(spec)
    listed: set[str] | None = None
    out = []
    for word in spec.entrypoint.args:
        value = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word
        if not value or value.startswith(("-", "/", "~", "$", "{")) or "://" in value:
            continue
        local = os.path.normpath(os.path.join(spec.workdir, value))
        if not os.path.exists(local):
            continue
        rel = os.path.relpath(local, root)
        if not rel.startswith(".."):
            if listed is None:
                script = spec.entrypoint.target if spec.entrypoint.kind is EntrypointKind.SCRIPT else None
                listing = list_workdir(Path(root), home, script)
                listed = set(listing.files) | {os.path.dirname(f) for f in listing.files}
                listed |= {p for f in listed for p in _parents(f)}
            if rel.replace(os.sep, "/") in listed:
                continue
        out.append(f"argument '{value}' is a relative path that will not exist on the hosts (they run in {remote_cwd or 'the shipped copy'}, "
                   f"which holds only the code of {root}): pass the data with --input NAME={value} and "
                   "$PHALANX_CHANNEL_NAME, give a path that exists on every host, or use --shared-fs")
    return out


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]
