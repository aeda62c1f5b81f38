"""The table: one line per case. Add a case by adding a line (and, if it needs one, a project
under projects/). Each case runs the same project as ``reference`` (python, torchrun, or
processes started by hand) and as ``phalanx run PHALANX`` from the same directory."""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

import numpy as np

from phalanx.backends.base import free_port

from .harness import Case


def _mnist_data(root: Path) -> None:
    """A tiny MNIST in the IDX files torchvision keeps under data/MNIST/raw (seeded, so both runs see it alike)."""
    raw = root / "examples" / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, count in (("train", 64), ("t10k", 32)):
        images = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=count, dtype=np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">HBBIII", 0, 8, 3, count, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">HBBI", 0, 8, 1, count) + labels.tobytes())


def _port() -> int:
    return free_port()  # as phalanx picks its own: one no port-0 listener beside us can take first


def _jax_by_hand(env: dict, cwd: Path) -> list[dict]:
    """Two processes as a user starts them by hand: coordinator, count and id in the environment."""
    addr = f"127.0.0.1:{_port()}"
    return [{"JAX_COORDINATOR_ADDRESS": addr, "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(i)} for i in range(2)]


def _jax_flags_by_hand(*names: str):
    """Two processes started by hand with coordinator, count and id as flags NAMES (what phalanx
    fills in for ``{master_addr}:{master_port}``, ``{num_nodes}``, ``{node_rank}``)."""
    def by_hand(env: dict, cwd: Path) -> list[tuple[dict, tuple[str, ...]]]:
        addr = f"127.0.0.1:{_port()}"
        return [({}, (names[0], addr, names[1], "2", names[2], str(i))) for i in range(2)]
    return by_hand


def _templated(*names: str) -> tuple[str, ...]:
    return (names[0], "{master_addr}:{master_port}", names[1], "{num_nodes}", names[2], "{node_rank}")


# TensorFlow takes seconds to import: its cases run as a user's do by default (warm) and not twice.
TF_STARTS = ("warm",)
LIBRARY_FLAGS = ("--coordinator_address", "--num_processes", "--process_id")  # projects/jax/proj/flagsinit.py
SCRIPT_FLAGS = ("--coordinator", "--processes", "--id")  # projects/jax/proj/jax_args_flags.py


def _sagemaker_tf(hosts: int):
    """Processes started by hand as a SageMaker TensorFlow job with ``distribution=
    {"multi_worker_mirrored_strategy": {"enabled": True}}`` on HOSTS instances starts them, one per
    instance: ``TF_CONFIG`` as sagemaker-tensorflow-training-toolkit builds it
    (``training._build_tf_config_for_mwms``: every host a worker, ``"environment": "cloud"``, set
    for one instance too), the ``SM_*`` phalanx promises (SageMaker sets more: ``SM_HPS``,
    ``SM_TRAINING_ENV``, ...), the model directory outside the project as ``/opt/ml/model`` is."""
    def by_hand(env: dict, cwd: Path) -> list[dict]:
        workers = [f"127.0.0.1:{_port()}" for _ in range(hosts)]  # SageMaker's port is 8890 on every host
        names = [f"algo-{i + 1}" for i in range(hosts)]
        model_dir = tempfile.mkdtemp(prefix="sm-model-", dir=cwd.parents[1])  # beside the project, in the test's directory
        common = {"SM_MODEL_DIR": model_dir, "SM_OUTPUT_DATA_DIR": model_dir, "SM_HOSTS": json.dumps(names),
                  "SM_CHANNELS": json.dumps(["training"]), "SM_CHANNEL_TRAINING": str(cwd / "data"),
                  "SM_NUM_GPUS": "0", "SM_NUM_CPUS": str(os.cpu_count())}
        return [{**common, "SM_CURRENT_HOST": names[i], "TF_CONFIG": json.dumps(
            {"cluster": {"worker": workers}, "environment": "cloud", "task": {"index": i, "type": "worker"}})}
            for i in range(hosts)]
    return by_hand


def _portless(tf_config: str | None) -> object:
    if tf_config is None:
        return None
    config = json.loads(tf_config)
    config["cluster"] = {k: [a.rsplit(":", 1)[0] + ":PORT" for a in v] for k, v in config["cluster"].items()}
    return config


def _saved_like_sagemaker(reference, phalanx) -> None:
    """Each worker saw the TF_CONFIG SageMaker gives it (ports aside) and every SM_* variable, and the
    chief's model is in SM_MODEL_DIR: under phalanx the job's outputs."""
    assert sorted(phalanx.seen) == sorted(reference.seen) != []
    for name, seen in reference.seen.items():
        theirs = phalanx.seen[name]
        assert _portless(theirs["tf_config"]) == _portless(seen["tf_config"]), (
            f"{name}: TF_CONFIG {theirs['tf_config']} under phalanx, {seen['tf_config']} as SageMaker sets it")
        assert {k for k in seen["env"] if k.startswith("SM_")} <= set(theirs["env"]), name
        assert theirs["saved"] == seen["saved"] and "saved_model.pb" in theirs["saved"], name
    (chief,) = [seen for name, seen in phalanx.seen.items() if name.endswith("seen_worker_0.json")]
    assert chief["model_dir"] == chief["env"]["SM_MODEL_DIR"] == chief["env"]["PHALANX_OUTPUT_DIR"]
    assert (Path(chief["model_dir"]) / "1" / "saved_model.pb").is_file()


def _jax_under_slurm(env: dict, cwd: Path) -> list[dict]:
    """Two processes as srun starts them: JAX's own cluster detection answers initialize()."""
    common = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "127.0.0.1", "SLURM_NTASKS": "2",
              "JAX_COORDINATOR_PORT": str(_port())}
    return [{**common, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i)} for i in range(2)]


CASES = [
    Case("plain_script", "plain", "proj", ("python", "hello.py", "a", "--b", "c"), ("hello.py", "a", "--b", "c")),
    Case("data_relative_to_cwd_checkpoint_to_cwd", "cwd_data", "proj", ("python", "train.py", "--data", "../data", "--epochs", "2"),
         ("train.py", "--data", "../data", "--epochs", "2")),
    Case("data_relative_to_file", "file_data", "proj", ("python", "scripts/evaluate.py"), ("scripts/evaluate.py",)),
    Case("traceback_names_the_users_files", "traceback", "proj", ("python", "run.py"), ("run.py",)),
    Case("module", "module", "proj", ("python", "-m", "pkg.train", "--batch", "3", "--lr", "0.1"),
         ("-m", "pkg.train", "--batch", "3", "--lr", "0.1")),
    Case("ddp_n2_vs_torchrun", "ddp", "proj", ("torchrun", "--standalone", "--nproc-per-node", "2", "ddp.py"),
         ("-n", "2", "ddp.py"), needs=("torch",), multi=True),
    Case("explicit_n1_is_torchrun", "ddp", "proj", ("torchrun", "--standalone", "--nproc-per-node", "1", "ddp.py"),
         ("-n", "1", "ddp.py"), needs=("torch",), multi=True),
    Case("lightning_starts_its_own_workers", "lightning", "proj", ("python", "train.py"), ("train.py",),
         needs=("lightning",)),
    Case("jax_initialize_no_arguments", "jax", "proj", ("python", "jax_noargs.py"),
         ("--framework", "jax", "-n", "2x1", "jax_noargs.py"), needs=("jax",), by_hand=_jax_under_slurm),
    Case("jax_initialize_own_arguments", "jax", "proj", ("python", "jax_args.py"),
         ("--framework", "jax", "-n", "2x1", "jax_args.py"), needs=("jax",), by_hand=_jax_by_hand),
    Case("jax_initialize_in_a_helper_after_phalanx", "jax", "proj", ("python", "jax_helper.py"),
         ("--framework", "jax", "-n", "2x1", "jax_helper.py"), needs=("jax",), by_hand=_jax_by_hand),
    Case("public_mnist_style_example", "mnist", "examples/mnist",
         ("python", "main.py", "--epochs", "1", "--batch-size", "16", "--log-interval", "1", "--save-model"),
         ("main.py", "--epochs", "1", "--batch-size", "16", "--log-interval", "1", "--save-model"),
         needs=("torch",), prepare=_mnist_data),
]

# What --framework and --spawn self promise (docs/environment.md), each against the real thing or a
# hand-set environment: tests/differential/test_contracts.py.
CONTRACTS = [
    # --spawn self: the program connects its processes itself; phalanx initializes nothing
    Case("jax_library_initializes_from_flags_under_spawn_self", "jax", "proj", ("python", "jax_flags.py"),
         ("--spawn", "self", "-n", "2x1", "jax_flags.py", *_templated(*LIBRARY_FLAGS)), needs=("jax",),
         by_hand=_jax_flags_by_hand(*LIBRARY_FLAGS)),
    Case("jax_never_initialized_under_spawn_self", "jax", "proj", ("python", "jax_never.py"),
         ("--spawn", "self", "-n", "2x1", "jax_never.py"), needs=("jax",), by_hand=_jax_by_hand),
    # --framework jax: phalanx initializes first; the program's later call, by whatever name, is a no-op
    Case("jax_library_initialize_no_arguments_after_phalanx", "jax", "proj", ("python", "jax_flags.py"),
         ("--framework", "jax", "-n", "2x1", "jax_flags.py"), needs=("jax",), by_hand=_jax_under_slurm),
    Case("jax_initialize_with_templated_arguments", "jax", "proj", ("python", "jax_args_flags.py"),
         ("--framework", "jax", "-n", "2x1", "jax_args_flags.py", *_templated(*SCRIPT_FLAGS)), needs=("jax",),
         by_hand=_jax_flags_by_hand(*SCRIPT_FLAGS)),
    # --framework tf: what a SageMaker MultiWorkerMirroredStrategy job sees, on one instance too
    Case("tf_mwms_one_process_like_a_one_instance_sagemaker_job", "tf", "proj", ("python", "train.py"),
         ("--framework", "tf", "--input", "training=data", "train.py"), needs=("tensorflow",),
         by_hand=_sagemaker_tf(1), check=_saved_like_sagemaker, starts=TF_STARTS),
    Case("tf_mwms_2x1_like_a_two_instance_sagemaker_job", "tf", "proj", ("python", "train.py"),
         ("--framework", "tf", "-n", "2x1", "--input", "training=data", "train.py"), needs=("tensorflow",),
         by_hand=_sagemaker_tf(2), check=_saved_like_sagemaker, starts=TF_STARTS),
]
