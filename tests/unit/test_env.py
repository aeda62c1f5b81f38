import json

from phalanx.core.env import Topology, fills_templates, initializes_jax, node_env, process_env
from phalanx.core.spec import Entrypoint, EntrypointKind, Framework, JobSpec, Resources, Spawn


def _spec(nnodes=2, nproc=2, **kw):
    return JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/w/t.py"), Resources(nnodes, nproc), name="t", **kw)


def _topo(nnodes=2, worker_ports=()):
    return Topology("jid", 3, ("10.0.0.1", "10.0.0.2")[:nnodes], 29500, worker_ports, "/s", "/o", "/j", num_gpus=8)


def test_node_env_contract():
    env = node_env(_spec(env={"USER_VAR": "1"}), _topo(), 1)
    assert env["PHALANX_JOB_ID"] == "jid"
    assert env["PHALANX_ATTEMPT"] == "3"
    assert env["PHALANX_NUM_NODES"] == "2"
    assert env["PHALANX_NODE_RANK"] == "1"
    assert env["PHALANX_NODE_ADDRS"] == "10.0.0.1,10.0.0.2"
    assert env["PHALANX_NPROC_PER_NODE"] == "2"
    assert env["PHALANX_STATE_DIR"] == "/s" and env["PHALANX_OUTPUT_DIR"] == "/o"
    assert json.loads(env["SM_HOSTS"]) == ["10.0.0.1", "10.0.0.2"]
    assert env["SM_CURRENT_HOST"] == "10.0.0.2"
    assert env["SM_NUM_GPUS"] == "8"
    assert env["SM_MODEL_DIR"] == "/o" and env["SM_OUTPUT_DATA_DIR"] == "/o"
    assert env["USER_VAR"] == "1"


def test_same_host_nodes_get_distinct_sm_hosts():
    topo = Topology("j", 0, ("127.0.0.1", "127.0.0.1"), 1, (), "/s", "/o", "/j")
    env = node_env(_spec(), topo, 1)
    assert json.loads(env["SM_HOSTS"]) == ["node-0", "node-1"] and env["SM_CURRENT_HOST"] == "node-1"


def test_process_env_spawn_self_is_torchrun_with_one_process_per_node():
    env = process_env(_spec(spawn=Spawn.SELF), _topo(), 1, 0)
    # --spawn self: one process per node, so node 1's process is rank 1 of 2
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("1", "2", "0")
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "29500"


def test_process_env_jax():
    env = process_env(_spec(nproc=1, framework=Framework.JAX), _topo(), 1, 0)
    assert env["JAX_COORDINATOR_ADDRESS"] == "10.0.0.1:29500"
    assert env["JAX_NUM_PROCESSES"] == "2" and env["JAX_PROCESS_ID"] == "1"


def test_process_env_tf_config():
    # SageMaker's form (sagemaker-tensorflow-training-toolkit, training._build_tf_config_for_mwms), phalanx's ports
    env = process_env(_spec(nproc=1, framework=Framework.TF), _topo(worker_ports=(4001, 4002)), 1, 0)
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": ["10.0.0.1:4001", "10.0.0.2:4002"]},
        "environment": "cloud",
        "task": {"type": "worker", "index": 1},
    }


def test_one_process_tf_gets_a_one_worker_tf_config_and_nothing_of_torchrun():
    spec = JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/w/t.py"), Resources(), name="t", framework=Framework.TF)
    env = process_env(spec, _topo(nnodes=1, worker_ports=(4001,)), 0, 0)
    assert env == {"TF_CONFIG": json.dumps({"cluster": {"worker": ["10.0.0.1:4001"]}, "environment": "cloud",
                                            "task": {"type": "worker", "index": 0}})}
    jax = JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/w/t.py"), Resources(), name="t", framework=Framework.JAX)
    assert process_env(jax, _topo(nnodes=1), 0, 0) == {}  # one JAX process needs no initialize: python's


def test_which_jobs_fill_templates_and_which_get_jax_initialized():
    def spec(res=Resources(), **kw):
        return JobSpec(Entrypoint(EntrypointKind.SCRIPT, "/w/t.py"), res, name="t", **kw)

    two, one = Resources(2, 1, explicit=True), Resources(1, 1, explicit=True)
    assert not fills_templates(spec()) and not fills_templates(spec(framework=Framework.TF))
    for filled in (spec(spawn=Spawn.SELF), spec(one), spec(two), spec(two, framework=Framework.TF),
                   spec(two, framework=Framework.JAX), spec(two, spawn=Spawn.SELF)):
        assert fills_templates(filled), filled
    assert initializes_jax(spec(two, framework=Framework.JAX)) and initializes_jax(spec(one, framework=Framework.JAX))
    for plain in (spec(framework=Framework.JAX), spec(two, framework=Framework.JAX, spawn=Spawn.SELF), spec(two)):
        assert not initializes_jax(plain), plain


def test_bootstrap_file_names_match_job_paths(tmp_path):
    # The bootstrap avoids importing JobPaths (worker start-up time); keep the names in step.
    from phalanx.core.paths import JobPaths
    from phalanx.launch import bootstrap

    paths = JobPaths(tmp_path)
    rank_dir = paths.rank_dir_template(2).replace("{rank}", "5")
    assert rank_dir == str(paths.rank_dir(2, 5))
    assert paths.rank_log(2, 5).name == bootstrap.OUTPUT_LOG
    assert paths.rank_error(2, 5).name == bootstrap.ERROR_JSON
    assert paths.rank_proc(2, 5).name == bootstrap.PROC_JSON
    assert paths.rank_user_metrics(2, 5).name == bootstrap.USER_METRICS
    assert paths.rank_torch_error(2, 5).name == bootstrap.TORCH_ERROR_JSON


def test_frozen_bytecode_dir_is_the_homes(tmp_path):
    from phalanx.core.paths import HomePaths
    from phalanx.launch.frozen import bytecode_dir

    home = HomePaths(tmp_path)
    home.code_objects.mkdir(parents=True)
    assert bytecode_dir(str(home.job("j1").code_dir)) == str(home.code_bytecode)
    assert bytecode_dir(str(home.sweep_code("s1")[0])) == str(home.code_bytecode)
    assert bytecode_dir(str(tmp_path / "elsewhere" / "code")) is None
