"""The role matrix of projects, as a table (docs/teams.md): what each verb answers for each role
in the job's project and whose job it is. ``tests/local/test_teams_face.py`` checks it against the
face, ``tests/server/test_teams.py`` over HTTP with the CLI; both generate every combination from
here, so neither can skip one."""

from __future__ import annotations

ROLES = ("viewer", "member", "admin")
TARGETS = ("own", "other", "foreign")  # the asker's own job, another member's, another project's
READS = ("status", "logs", "metrics", "artifacts", "wait")
ACTS = ("stop", "resume", "rm", "interrupt")
VERBS = READS + ACTS


def expected(verb: str, role: str, target: str) -> str:
    """ok, denied (403: not yours to do), or hidden (answered as a job that does not exist)."""
    if target == "foreign":
        return "hidden"
    if verb in READS or role == "admin":
        return "ok"
    return "ok" if role == "member" and target == "own" else "denied"
