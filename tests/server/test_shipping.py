"""Code and local inputs travel to the server by content: a rerun of unchanged code sends the
manifest and no object; a changed file sends that file only; a local ``--input`` is sent once;
the job runs in its shipped copy with python's cwd semantics there (relative paths, files it
writes to cwd), and a script writing into a shipped file does not change the stored object."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from tests.server.conftest import Person

pytestmark = [pytest.mark.local]

READS = """
import os, sys
print(open("config/settings.txt").read().strip(), flush=True)
data = os.environ["PHALANX_CHANNEL_DATA"]
print("data:", sorted(os.listdir(data)), open(os.path.join(data, "a.txt")).read().strip(), flush=True)
print("cwd is the copy:", os.path.realpath(os.getcwd()) == os.path.dirname(os.path.realpath(__file__)), flush=True)
print("submitted by", os.environ.get("PHALANX_USER"), flush=True)
with open("config/settings.txt", "w") as fh:  # a script writing into its own copy
    fh.write("changed by the job\\n")
open("written.txt", "w").write("left in cwd")
"""


def _puts(url: str) -> int:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    found = re.search(r'_count\{method="PUT",route="/api/v1/objects/\{ref\}"\} (\d+)', text)
    return int(found.group(1)) if found else 0


def test_unchanged_code_and_inputs_are_sent_once(server, tmp_path):
    token = server.add_user("jo")
    server.start()
    jo = Person("jo", tmp_path / "jo", token)
    project = jo.root / "project"
    (project / "config").mkdir(parents=True)
    (project / "data").mkdir()
    (project / "reads.py").write_text(READS)
    (project / "config" / "settings.txt").write_text("settings from the laptop\n")
    (project / "data" / "a.txt").write_text("alpha\n")
    (project / "data" / "b.bin").write_bytes(bytes(range(256)) * 64)
    for n in range(20):
        (project / f"module_{n}.py").write_text(f"VALUE = {n}\n" * 50)
    assert jo.login(server.url).returncode == 0

    first = jo.run("run", "--input", "data=./data", "reads.py", cwd=project)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == ["settings from the laptop", "data: ['a.txt', 'b.bin'] alpha", "cwd is the copy: True",
                                         "submitted by jo"]
    sent = _puts(server.url)
    assert sent >= 24, "every file's content went once (code and input)"

    again = jo.run("run", "--input", "data=./data", "reads.py", cwd=project)
    assert again.returncode == 0 and again.stdout.splitlines()[0] == "settings from the laptop", \
        "the first job's write into its copy changed neither the laptop's file nor the stored object"
    assert _puts(server.url) == sent, "a rerun of unchanged code sends no object"
    assert (project / "config" / "settings.txt").read_text() == "settings from the laptop\n"

    (project / "module_3.py").write_text("VALUE = 'changed'\n")
    third = jo.run("run", "--input", "data=./data", "reads.py", cwd=project)
    assert third.returncode == 0
    assert _puts(server.url) == sent + 1, "one changed file: one object"
    jobs = json.loads(jo.run("ps", "--all", "--json").stdout)
    shipped = [server.home / "shipped" / j["id"] for j in jobs]
    assert all((s / "written.txt").read_text() == "left in cwd" for s in shipped), "each job its own working copy"
    removed = jo.run("rm", jobs[0]["id"])
    assert removed.returncode == 0 and not shipped[0].exists(), "the shipped copy goes with its job"

    # "Run again" from the dashboard: the new job gets a copy of its own, so removing the first keeps it.
    request = urllib.request.Request(f"{server.url}/api/jobs/{jobs[1]['id']}/retry", method="POST",
                                     headers={"Authorization": f"Bearer {token}"})
    again_id = json.loads(urllib.request.urlopen(request, timeout=60).read())["id"]
    assert jo.run("wait", again_id).returncode == 0
    assert jo.run("rm", jobs[1]["id"]).returncode == 0
    assert (server.home / "shipped" / again_id / "written.txt").exists()
    assert jo.run("logs", again_id).stdout.startswith("changed by the job"), "it ran in a copy of the copy"


def test_dry_run_shows_the_plan_as_the_server_would_run_it(server, tmp_path):
    token = server.add_user("kim")
    server.start()
    kim = Person("kim", tmp_path / "kim", token)
    (kim.root / "p").mkdir(parents=True)
    (kim.root / "p" / "train.py").write_text("print('x')\n")
    assert kim.login(server.url).returncode == 0
    plan = kim.run("run", "--dry-run", "-n", "2", "train.py", cwd=kim.root / "p")
    assert plan.returncode == 0, plan.stderr
    assert str(server.home / "shipped") in plan.stdout and "--nproc-per-node" in plan.stdout.replace("_", "-")
    assert _puts(server.url) == 0, "a dry run sends no code"
    assert not (server.home / "jobs").exists() or not any((server.home / "jobs").iterdir())


def test_an_input_naming_a_job_names_one_of_the_servers_jobs(server, tmp_path):
    token = server.add_user("max")
    server.start()
    max_ = Person("max", tmp_path / "max", token)
    project = max_.root / "p"
    project.mkdir(parents=True)
    (project / "make.py").write_text("import os\nopen(os.path.join(os.environ['PHALANX_OUTPUT_DIR'], 'w.txt'), 'w').write('weights')\n")
    (project / "use.py").write_text("import os\nprint(open(os.path.join(os.environ['PHALANX_CHANNEL_PREV'], 'w.txt')).read())\n")
    assert max_.login(server.url).returncode == 0
    assert max_.run("run", "--name", "prep", "make.py", cwd=project).returncode == 0
    used = max_.run("run", "--input", "prev=job:prep", "use.py", cwd=project)
    assert used.returncode == 0 and used.stdout == "weights\n", used.stderr
    missing = max_.run("run", "--input", "prev=job:nosuchjob", "use.py", cwd=project)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "nosuchjob" in missing.stderr
