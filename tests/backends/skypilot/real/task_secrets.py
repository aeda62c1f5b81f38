"""Run by test_real_skypilot.py with the real skypilot 0.14.1: a golden task read by SkyPilot, given
the job's secret values the way phalanx gives them at launch (``client.with_secrets``). Prints one
JSON line: what the run step's environment gets, and whether the value is in what SkyPilot shows
(the task as the user gave it) and in what it sends with the launch request."""

import json
import sys

import sky
import yaml
from sky import task as task_lib

from phalanx.backends.skypilot import client

VALUE = "sky-real-canary-4Jq9"
config = yaml.safe_load(open(sys.argv[1]).read())
task = client.with_secrets(client.load_task(sky, config), {"HF_TOKEN": VALUE})
env = task_lib.get_plaintext_envs_and_secrets(task.envs_and_secrets)
print(json.dumps({
    "run_env": env.get("HF_TOKEN") == VALUE,
    "shown": VALUE in yaml.safe_dump(task.to_yaml_config(use_user_specified_yaml=True)),
    "sent": VALUE in yaml.safe_dump(task.to_yaml_config()),
}))
