"""The table: one line per case. Add a case by adding a line (and, if it needs one, a project
under projects/). Each case runs the same project as ``reference`` (python, torchrun, or
processes started by hand) and as ``phalanx run PHALANX`` from the same directory."""

from __future__ import annotations

import struct
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


def _jax_by_hand(env: dict) -> list[dict]:
    """Two processes as a user starts them by hand: coordinator, count and id in the environment."""
    addr = f"127.0.0.1:{_port()}"
    return [{"JAX_COORDINATOR_ADDRESS": addr, "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(i)} for i in range(2)]


def _jax_under_slurm(env: dict) -> list[dict]:
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
