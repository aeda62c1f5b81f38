"""The Ray Tune side of bench/bench_sweep.py. Runs under an interpreter that has ``ray[tune]``
(a separate venv, so the project's stays lean); bench_sweep.py starts it:

    RAY_PYTHON bench/sweep_ray.py --trial-python PY --lrs JSON --parallel 2 --storage DIR

Every trial is a function trainable that runs ``PY bench/sweep_trial.py --lr X`` as a
subprocess (the same interpreter and script as the phalanx and xargs runs), parses its
``loss=`` line and reports it. Ray is pinned to 127.0.0.1 with no dashboard and no usage
stats. Prints one JSON line: import, ray.init, Tuner.fit and shutdown times, and the best loss.
"""

from __future__ import annotations

import time

T_START = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # no CSV/JSON/TensorBoard loggers per trial

TRIAL = str(Path(__file__).resolve().parent / "sweep_trial.py")
LOSS = re.compile(r"loss=([-+0-9.eE]+)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trial-python", required=True)
    parser.add_argument("--lrs", required=True, help="JSON list of learning rates (one trial each)")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--storage", required=True, help="Tune's storage_path (a scratch directory)")
    parser.add_argument("--no-reuse-actors", action="store_true",
                        help="Tune's default: a new worker process per trial (slower); by default actors are reused")
    args = parser.parse_args()
    lrs = json.loads(args.lrs)
    trial_python = args.trial_python

    def trainable(config: dict) -> None:
        from ray import tune as _tune

        out = subprocess.run(
            [trial_python, TRIAL, "--lr", repr(config["lr"])],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True,
        )
        _tune.report({"loss": float(LOSS.findall(out.stdout)[-1])})

    import ray
    from ray import tune

    t_imported = time.time()
    ray.init(num_cpus=args.parallel, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, logging_level="ERROR", configure_logging=True)
    t_init = time.time()
    tuner = tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search(lrs)},
        tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=args.parallel,
                                    reuse_actors=not args.no_reuse_actors),
        run_config=tune.RunConfig(storage_path=args.storage, name="bench", verbose=0),
    )
    results = tuner.fit()
    t_fit = time.time()
    best = results.get_best_result()
    n_ok = sum(1 for r in results if r.error is None)
    ray.shutdown()
    t_end = time.time()
    print(json.dumps({
        "import_s": t_imported - T_START, "init_s": t_init - t_imported, "fit_s": t_fit - t_init,
        "shutdown_s": t_end - t_fit, "fit_start": t_init, "fit_end": t_fit,
        "best_loss": best.metrics["loss"], "best_lr": best.config["lr"], "trials_ok": n_ok,
        "reuse_actors": not args.no_reuse_actors, "ray_version": ray.__version__,
    }), flush=True)


if __name__ == "__main__":
    main()
