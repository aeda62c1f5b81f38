"""Check the TF_CONFIG a launcher hands to TensorFlow's MultiWorkerMirroredStrategy.

Needs no TensorFlow: it only parses the environment variable the way
TensorFlow would read it.
"""

import json
import os
import sys


def read_tf_config():
    raw = os.environ.get("TF_CONFIG")
    if raw is None:
        raise ValueError("TF_CONFIG is not set")
    try:
        config = json.loads(raw)
        workers = config["cluster"]["worker"]
        task = config["task"]
        index = task["index"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"TF_CONFIG is malformed ({type(e).__name__}: {e}): {raw!r}")
    if not isinstance(workers, list) or not all(isinstance(w, str) for w in workers):
        raise ValueError(f"TF_CONFIG cluster.worker must be a list of host:port strings: {raw!r}")
    if task.get("type") != "worker":
        raise ValueError(f"TF_CONFIG task.type must be 'worker': {raw!r}")
    if not isinstance(index, int) or not 0 <= index < len(workers):
        raise ValueError(f"TF_CONFIG task.index must be in [0, {len(workers)}): {raw!r}")
    return workers, index


def main():
    try:
        workers, index = read_tf_config()
    except ValueError as e:
        print(f"tf_config_check: {e}", file=sys.stderr)
        return 1
    print(f"tf_config workers={len(workers)} index={index}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
