"""The Ray backend: a phalanx driver, submitted with Ray's Jobs API, runs the node agents of a job
on an existing Ray cluster. ``backend.py`` is the adapter to the backend interface; the rest is
one module per concern (see each module's docstring). Ray itself is imported only by the
modules that talk to it, inside the functions that do."""
