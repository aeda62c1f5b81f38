"""phalanx against the REAL SkyPilot library (skypilot 0.14.1 in its own environment, ``.venv-sky``:
see skyenv.py), not the vendored schema or the fake ``sky`` of test_adapter.py:

- every golden task is read by SkyPilot itself (``sky.Task.from_yaml_config``: its schema and field
  parsers) into the resources phalanx meant, and what it refuses reaches the user as one line;
- every SDK call phalanx makes (client.py) is made against a real SkyPilot API server (in a network
  namespace with only loopback, state in a temporary HOME: realsky.py) with phalanx's arguments:
  the signatures, what comes back (request ids, JobExitCode) and what is raised are SkyPilot's;
- ``phalanx run --backend skypilot`` there, with no cloud enabled, stops before anything is
  recorded with one line and exit 2 (SkyPilot's dry run: ``sky.launch(..., dryrun=True)``).

What cannot run here: a launch that gets machines (no cloud); that path is test_adapter.py's fake
and the opt-in ``sky_live`` test (tests/cluster/test_cloud_live.py).
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from . import realsky

HERE = Path(__file__).parent
server = pytest.mark.cluster  # a real SkyPilot API server started by the tests (realsky.py)
GOLDEN = HERE.parent / "golden"


def _probe(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tasks(sky_python, tmp_path_factory):
    env = realsky.sky_env(tmp_path_factory.mktemp("skytasks"))
    return _probe(subprocess.run([str(sky_python), str(HERE / "real" / "tasks.py"), str(GOLDEN),
                                  str(HERE / "data" / "skypilot_task_schema_0.14.1.json")], env=env,
                                 capture_output=True, text=True, timeout=120))


def test_real_skypilot_is_the_version_phalanx_was_checked_against(tasks):
    assert tasks["version"] == "0.14.1"
    assert tasks["vendored_schema_is_skypilots"]  # test_task.py's vendored schema is this library's own


@pytest.mark.parametrize("case", ["skypilot_cpu_tf", "skypilot_h100_2x8_spot", "skypilot_managed_k8s"])
def test_real_skypilot_reads_each_golden_task_as_phalanx_meant(tasks, case):
    golden = yaml.safe_load((GOLDEN / f"{case}.yaml").read_text())
    task, res = tasks["tasks"][case], golden["resources"]
    assert (task["name"], task["num_nodes"], task["workdir"], task["run"], task["setup"], task["envs"]) == \
        (golden["name"], golden["num_nodes"], golden["workdir"], golden["run"], golden.get("setup"), golden["envs"])
    if "accelerators" in res:
        name, count = res["accelerators"].split(":")
        assert task["accelerators"] == {name: int(count)}
    assert task["use_spot"] is bool(res.get("use_spot"))
    assert (task["instance_type"], task["cpus"], task["memory"]) == (res.get("instance_type"), res.get("cpus"), res.get("memory"))
    if "disk_size" in res:
        assert task["disk_size"] == res["disk_size"]
    infra = res.get("infra")
    if infra == "aws":
        assert task["cloud"] == "AWS"
    elif infra:
        assert (task["cloud"], task["region"]) == ("Kubernetes", infra.split("/", 1)[1])
        assert task["image_id"] == {task["region"]: res["image_id"]}
    else:
        assert task["cloud"] is None  # wherever SkyPilot finds it cheapest
    assert task["job_recovery"] == res.get("job_recovery")
    if res.get("job_recovery"):  # the strategy exists and SkyPilot's recovery reads every key phalanx writes
        assert tasks["recovery"][case] == {"strategy": "EagerFailoverStrategyExecutor", "unread": []}


@pytest.mark.parametrize("case,skypilot_says", [
    ("num_node", "did you mean 'num_nodes'"), ("spot_yes", "$.use_spot"), ("gpus_eight", "H100:eight"),
    ("infra_nocloud", "$.infra"), ("cpus_x", "cpus"),
])
def test_real_skypilot_refusals_reach_the_user_as_one_line(tasks, case, skypilot_says):
    refused = tasks["refused"][case]
    assert refused is not None, f"SkyPilot accepted the broken task {case}"
    message = refused["phalanx"]
    assert message.startswith("SkyPilot refuses the task: ") and skypilot_says in message and "\n" not in message


@pytest.fixture(scope="module")
def sdk(sky_server):
    return _probe(sky_server.run([str(sky_server.python), str(HERE / "real" / "sdk.py")], timeout=300))


@server
def test_real_sdk_launch_is_a_request_id_and_no_cloud_is_skypilots_error(sdk):
    assert sdk["launch_request"] == {"type": "RequestId", "is_str": True}
    for call in ("launch", "launch_kept", "jobs_launch"):
        assert (sdk[call]["raised"], sdk[call]["module"]) == ("NoCloudAccessError", "sky.exceptions"), sdk[call]
        assert "sky check" in sdk[call]["message"]


@server
def test_real_sdk_preflight_says_no_cloud_in_one_line_exit_2(sdk):
    check = sdk["preflight"]
    assert (check["raised"], check["exit_code"]) == ("UsageError", 2)
    assert check["message"].startswith("SkyPilot has no cloud enabled") and "run `sky check`" in check["message"]
    assert "\x1b[" not in check["message"]


@server
def test_real_sdk_status_of_what_is_not_there_is_ended(sdk):
    """attach asks sky.job_status / sky.jobs.queue_v2: a cluster or controller that is not there
    means the job has ended (nothing to follow again)."""
    assert sdk["running"] == {"returned": "bool", "value": False}
    assert sdk["jobs_running"] == {"returned": "bool", "value": False}


@server
def test_real_sdk_tails_of_nothing_raise_skypilots_errors(sdk):
    assert sdk["tail"]["raised"] == "ClusterDoesNotExist"
    assert (sdk["jobs_tail"]["raised"], sdk["jobs_tail"]["message"]) == ("ClusterNotUpError", "No in-progress managed jobs.")


@server
def test_real_sdk_stop_of_what_is_not_there_is_done(sdk):
    for call in ("stop", "stop_kept", "stop_before_job", "jobs_stop", "jobs_stop_by_name", "stop_while_launching"):
        assert sdk[call] == {"returned": None, "value": None}, (call, sdk[call])
    # api_cancel really ended the launch request: waiting on it raises SkyPilot's RequestCancelled
    assert sdk["launch_after_stop"]["raised"] == "RequestCancelled"


@server
def test_real_sdk_job_exit_codes_are_what_phalanx_maps(sdk):
    assert sdk["job_exit_codes"] == {"SUCCEEDED": 0, "FAILED": 100, "NOT_FINISHED": 101, "NOT_FOUND": 102, "CANCELLED": 103}
    assert sdk["outcomes"] == {"0": ["SUCCEEDED", True], "100": ["FAILED", False], "101": ["NOT_FINISHED", False],
                               "102": ["NOT_FOUND", False], "103": ["CANCELLED", False], "null": ["no exit code", False]}


@server
def test_real_backend_start_without_a_cloud_ends_each_node_with_skypilots_reason(sky_server, tmp_path):
    scratch = tmp_path / "adapter"
    runs = _probe(sky_server.run([str(sky_server.python), str(HERE / "real" / "adapter.py"), str(scratch)], timeout=400))
    for kind in ("cluster", "managed"):
        run = runs[kind]
        assert run["staged"] and run["exitcodes"] == [1, 1] and run["stopped_by"] == [None, None], run
        assert "phalanx: SkyPilot: NoCloudAccessError: Cloud access is not set up. Run: sky check" in run["agent_log"], run
        assert "\x1b[" not in run["agent_log"]
        assert all("NoCloudAccessError" in error for error in run["errors"])
    stopped = runs["stopped"]  # stopped at once: the node ends as stopped, whatever SkyPilot said
    assert stopped["exitcodes"] == [143, 143] and stopped["stopped_by"] == ["SIGTERM", "SIGTERM"], stopped


@server
@pytest.mark.parametrize("options,code,says", [
    (["--cpus", "2+"], 2, "phalanx: error: SkyPilot has no cloud enabled (Cloud access is not set up. Run: sky check); set up a cloud's credentials and run `sky check`"),
    (["--gpus", "H100:eight"], 2, "phalanx: error: SkyPilot refuses the task: The \"accelerators\" field as a str should be <name> or <name>:<cnt>. Found: 'H100:eight'"),
    # SkyPilot fetches its GPU catalogue from GitHub: unreachable here, said in one line, exit 1
    (["--gpus", "H100:8"], 1, "phalanx: error: SkyPilot could not check the task: CloudError: "),
])
def test_real_cli_refuses_before_recording_anything(sky_server, tmp_path, options, code, says):
    (tmp_path / "train.py").write_text("print('hello')\n")
    home = tmp_path / "phx"
    run = sky_server.run([str(sky_server.python), "-m", "phalanx", "run", "--backend", "skypilot", *options, "-n", "2x1", "train.py"],
                         cwd=tmp_path, env={"PHALANX_HOME": str(home)}, timeout=300)
    assert run.returncode == code, run.stdout + run.stderr
    assert run.stderr.startswith(says) and len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr, run.stderr
    ps = sky_server.run([str(sky_server.python), "-m", "phalanx", "ps", "--all"], cwd=tmp_path, env={"PHALANX_HOME": str(home)})
    assert ps.returncode == 0 and "train" not in ps.stdout, ps.stdout  # nothing recorded


@server
@pytest.mark.slow
def test_real_cli_first_run_starts_skypilots_server_and_still_says_one_line(sky_python, tmp_path):
    """A user's first run: no API server yet, so SkyPilot's SDK starts one itself (it keeps running:
    SkyPilot's daemon; ended here by PID) and says so on stdout. The error is one line either way:
    no cloud (exit 2), or, on a machine so loaded that the server is not up within SkyPilot's own
    60 s (server/common.py WAIT_APISERVER_START_TIMEOUT_SEC), SkyPilot's "Failed to start" (exit 1)."""
    if os.environ.get("PHALANX_SKY_SERVER") != "1":
        pytest.skip("a real SkyPilot API server: opt in with PHALANX_SKY_SERVER=1 (see docs/skypilot.md)")
    why = realsky.usable()
    if why:
        pytest.skip(why)
    (tmp_path / "train.py").write_text("print('hello')\n")
    namespace = realsky.SkyServer(sky_python, tmp_path / "home", serve=False)
    try:
        run = namespace.run([str(sky_python), "-m", "phalanx", "run", "--backend", "skypilot", "--cpus", "2+", "train.py"],
                            cwd=tmp_path, timeout=400)
        started = namespace.servers()
    finally:
        namespace.stop()
    assert len(run.stderr.splitlines()) == 1 and "Traceback" not in run.stderr, run.stdout + run.stderr
    assert (run.returncode, run.stderr.startswith("phalanx: error: SkyPilot has no cloud enabled")) == (2, True) or \
        (run.returncode, "Failed to start SkyPilot API server" in run.stderr) == (1, True), run.stdout + run.stderr
    assert "Starting a local server" in run.stdout and started
    assert not namespace.ours()


def test_phalanx_cli_works_with_the_click_skypilot_brings(sky_python, tmp_path):
    """skypilot 0.14.1 pins click<8.2; `pip install 'phalanx[skypilot]'` gets click 8.1.8: the CLI
    still answers (help, bare command, a usage error in one line) and ps does not import sky."""
    env = {**realsky.sky_env(tmp_path), "PHALANX_HOME": str(tmp_path / "phx")}

    def cli(*args):
        return subprocess.run([str(sky_python), *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)

    assert cli("-c", "import click; print(click.__version__)").stdout.startswith("8.1.")
    assert cli("-m", "phalanx", "--help").returncode == 0
    bare = cli("-m", "phalanx")
    assert bare.returncode == 0 and "Usage:" in bare.stdout, bare.stderr
    (tmp_path / "t.py").write_text("pass\n")
    bad = cli("-m", "phalanx", "run", "--cold=yes", "t.py")
    assert bad.returncode == 2 and bad.stderr.startswith("phalanx: error: ") and len(bad.stderr.splitlines()) == 1, bad.stderr
    ps = cli("-X", "importtime", "-m", "phalanx", "ps")
    assert ps.returncode == 0, ps.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in ps.stderr.splitlines() if line.startswith("import time:")}
    assert not {m for m in imported if m == "sky" or m.startswith("sky.")}


def test_real_skypilot_takes_secrets_into_the_run_environment_not_into_what_it_shows(sky_python, tmp_path_factory):
    """phalanx's --secret on SkyPilot (client.with_secrets) with the real library: the run step's
    environment gets the value; the task SkyPilot shows (the one as given) does not hold it; the
    launch request SkyPilot sends to its API server does (docs/secrets.md says so: its requests
    database keeps it, readable by the request's owner and the server's host)."""
    env = realsky.sky_env(tmp_path_factory.mktemp("skysecrets"))
    said = _probe(subprocess.run([str(sky_python), str(HERE / "real" / "task_secrets.py"), str(GOLDEN / "skypilot_cpu_tf.yaml")],
                                 env=env, capture_output=True, text=True, timeout=120))
    assert said == {"run_env": True, "shown": False, "sent": True}
