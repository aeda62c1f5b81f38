"""The face's team part (``LocalFace`` has it too): projects, members, quotas and budgets, the
audit log, and what every submit checks first (the job's project, the submitter's role in it,
its quota and budget). Each call acts as the face's ``Principal``; the rules are
``core/identity.py``'s and ``api/projects.py``'s, the same for this machine's store, ``phalanx
ui`` and a team server.
"""

from __future__ import annotations

from typing import Any

from ..core.identity import Principal
from ..core.spec import JobSpec
from ..errors import UsageError
from ..store import Store
from . import audit, projects


class TeamVerbs:
    principal: Principal

    def _store(self) -> Store:
        raise NotImplementedError

    # -- projects ---------------------------------------------------------------------------------

    def projects(self) -> list[dict[str, Any]]:
        return projects.list_projects(self._store(), self.principal)

    def members(self, project: str) -> list[dict[str, Any]]:
        return projects.members(self._store(), self.principal, project)

    def project_add(self, name: str) -> dict[str, Any]:
        return projects.add_project(self._store(), self.principal, name)

    def project_rm(self, name: str) -> dict[str, Any]:
        return projects.remove_project(self._store(), self.principal, name)

    def project_set(self, name: str, limits: dict[str, Any]) -> dict[str, Any]:
        known = {"max_gpus", "max_cpus", "max_jobs", "budget", "kueue_queue", "slurm_account", "slurm_qos"}
        unknown = sorted(set(limits) - known)
        if unknown:
            raise UsageError(f"unknown limit '{unknown[0]}'", f"limits: {', '.join(sorted(known))}")
        return projects.set_limits(self._store(), self.principal, name, **limits)

    def member_set(self, project: str, user: str, role: str, new: bool = True) -> dict[str, Any]:
        return projects.set_member(self._store(), self.principal, project, user, role, new)

    def member_rm(self, project: str, user: str) -> dict[str, Any]:
        return projects.remove_member(self._store(), self.principal, project, user)

    def project_use(self, name: str) -> dict[str, Any]:
        return projects.use_project(self._store(), self.principal, name)

    # -- the audit log ----------------------------------------------------------------------------

    def events(self, since: str | None = None, user: str | None = None, project: str | None = None,
               before: int | None = None, limit: int = 100) -> list[dict[str, Any]]:
        from ..monitor.logindex import parse_since

        return audit.events(self._store(), self.principal, parse_since(since, "--since") if since else None, user,
                            project, before, limit)

    # -- what a submit checks first ---------------------------------------------------------------

    def _admit_spec(self, spec: JobSpec) -> JobSpec:
        """``spec`` in the project it goes to (checked: it exists, the submitter may run jobs in
        it, the job fits its quota at all and its budget this month); on a team server the ranks
        also learn the project (``PHALANX_PROJECT``)."""
        from ..supervise import admission, budget

        store, who = self._store(), self.principal
        name = projects.project_for(store, who, spec.project)
        project = store.projects.get(name)
        assert project is not None
        gpus, cpus = admission.needs(spec.with_(project=name))
        if admission.applies(project, spec.backend):
            big = admission.too_big(project, gpus, cpus)
            if big:
                raise UsageError(f"this job can never start: {big}", f"ask for less, or ask an admin of {name} to raise it")
        budget.check(store, spec, project, gpus, cpus, budget.admins(store))
        spec = spec.with_(project=name)
        if not who.local:
            spec = spec.with_(env={**spec.env, "PHALANX_PROJECT": name})
        queue = _queue_options(spec, project)
        return spec.with_(backend_options={**spec.backend_options, **queue}) if queue else spec


def _queue_options(spec: JobSpec, project: Any) -> dict[str, Any]:
    """The cluster queue a project maps to, where the job did not name one: Kubernetes jobs go to
    its Kueue LocalQueue, SLURM jobs are charged to its account (and QOS)."""
    given = dict(spec.backend_options or {})
    out: dict[str, Any] = {}
    if spec.backend == "k8s" and project.kueue_queue and not given.get("queue"):
        out["queue"] = project.kueue_queue
    if spec.backend == "slurm":
        if project.slurm_account and not given.get("account"):
            out["account"] = project.slurm_account
        if project.slurm_qos and not any(str(line).startswith("--qos") for line in given.get("sbatch") or ()):
            out["sbatch"] = (*tuple(given.get("sbatch") or ()), f"--qos={project.slurm_qos}")
    return out
