"""Every golden task as the real SkyPilot reads it (``sky.Task.from_yaml_config``: its schema and
its field parsers), and what it refuses. Arguments: the golden directory, the vendored schema."""

import copy
import json
import sys
from pathlib import Path

import sky
import yaml

from phalanx.backends.skypilot import client
from phalanx.errors import UsageError


def parsed(config):
    task = sky.Task.from_yaml_config(copy.deepcopy(config))
    (res,) = list(task.resources)
    return {
        "name": task.name, "num_nodes": task.num_nodes, "workdir": task.workdir, "run": task.run, "setup": task.setup,
        "envs": dict(task.envs), "accelerators": res.accelerators, "use_spot": res.use_spot,
        "cloud": None if res.cloud is None else str(res.cloud), "region": res.region, "instance_type": res.instance_type,
        "cpus": res.cpus, "memory": res.memory, "disk_size": res.disk_size, "image_id": res.image_id, "job_recovery": res.job_recovery,
    }


def refused(config):
    try:
        sky.Task.from_yaml_config(copy.deepcopy(config))
    except Exception as exc:  # noqa: BLE001
        try:
            client.load_task(sky, config)
        except UsageError as usage:
            return {"type": type(exc).__name__, "phalanx": str(usage)}
        return {"type": type(exc).__name__, "phalanx": None}
    return None


def vendored_schema_is_skypilots(path):
    """data/skypilot_task_schema_0.14.1.json (test_task.py's fast check) is this library's schema."""
    from sky.utils import schemas

    schema = schemas.get_task_schema()
    schema["properties"]["resources"] = schemas.get_resources_schema()
    return json.loads(json.dumps(schema)) == json.loads(Path(path).read_text())


goldens = {path.stem: yaml.safe_load(path.read_text()) for path in sorted(Path(sys.argv[1]).glob("skypilot_*.yaml"))}
base = goldens["skypilot_h100_2x8_spot"]
bad = {
    "num_node": {**base, "num_node": 2},
    "spot_yes": {**base, "resources": {**base["resources"], "use_spot": "yes"}},
    "gpus_eight": {**base, "resources": {**base["resources"], "accelerators": "H100:eight"}},
    "infra_nocloud": {**base, "resources": {**base["resources"], "infra": "nocloud"}},
    "cpus_x": {**base, "resources": {"cpus": "x"}},
}


def recovery(config):
    """SkyPilot's schema lets any key into job_recovery; StrategyExecutor.make (sky/jobs/recovery_strategy.py)
    reads these and hands the rest to the strategy: the name must be registered, the keys these."""
    from sky.utils import registry

    job_recovery = config["resources"].get("job_recovery")
    if job_recovery is None:
        return None
    return {"strategy": registry.JOBS_RECOVERY_STRATEGY_REGISTRY.from_str(job_recovery["strategy"]).__name__,
            "unread": sorted(set(job_recovery) - {"strategy", "max_restarts_on_errors", "recover_on_exit_codes"})}

print(json.dumps({"version": sky.__version__, "vendored_schema_is_skypilots": vendored_schema_is_skypilots(sys.argv[2]), "tasks": {k: parsed(v) for k, v in goldens.items()},
                  "refused": {k: refused(v) for k, v in bad.items()}, "recovery": {k: recovery(v) for k, v in goldens.items()}}, default=str))
