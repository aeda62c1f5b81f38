"""What a script saw, written to ``seen_<tag>.json`` in its working directory (the differential
tests copy this module beside each project's scripts; the scripts call ``record(globals())``)."""

import json
import os
import sys


def record(main_globals, tag=None, **extra):
    tag = tag if tag is not None else os.environ.get("RANK", "0")
    spec = main_globals.get("__spec__")
    seen = {
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "file": main_globals.get("__file__"),
        "path0": sys.path[0],
        "name": main_globals.get("__name__"),
        "globals": sorted(k for k in main_globals if k.startswith("__")),
        "spec": getattr(spec, "name", None),
        "package": main_globals.get("__package__"),
        "loader": type(main_globals.get("__loader__")).__mro__[-2].__name__ if main_globals.get("__loader__") else None,
        "env": dict(os.environ),
        **extra,
    }
    with open(f"seen_{tag}.json", "w") as fh:
        json.dump(seen, fh, indent=1, sort_keys=True)
