"""Where a warm pool starts: inside the worker bootstrap's ``main()``.

    python -u -m phalanx.launch.bootstrap --warm-pool --socket DIR/KEY.sock --lock-fd N
                                          [--idle SECONDS] [--preload torch,...]

The pool is a worker bootstrap that stopped at the top of ``main()`` to serve (``warm_server``).
A child it forks for a worker returns from this call into ``main()`` and carries on as a cold
worker would: its Python stack (what ``traceback.print_stack``, ``inspect.stack`` or a faulthandler
dump show) is exactly a cold worker's, and it starts with the modules a cold worker has there.

Only ``sys`` and the import recorder are imported here: everything the pool imports after this
point is recorded, so that a child can keep it aside (``warm_imports``).
"""

import sys

from .recorder import Recorder


def serve(argv: "list[str]", baseline: "tuple[str, ...]") -> "list[str]":
    """Serve until idle or stopped (the pool never returns: it exits); in a forked worker child,
    return the bootstrap's own arguments (``--script FILE ARGS...``)."""
    recorder = Recorder(baseline)
    # What a cold worker's imports would have put in the path importer cache; not this package's own
    # directory (``phalanx.launch.warm``), which only the pool imports from.
    here = __file__.rpartition("/")[0]
    recorder.importers = (sys.path[0], *(k for k in sys.path_importer_cache if k not in (sys.path[0], here)))
    recorder.start()
    from . import server as warm_server

    return warm_server.main(argv, recorder)
