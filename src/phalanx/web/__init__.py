"""The dashboard (``phalanx ui``): the store and the job directories as pages and a JSON API,
and the buttons that act on jobs (stop, resume, run again, delete; POST only, behind ``guard``).

``app`` is the Starlette application (JSON API + pages) and reads through the face's views;
``actions`` runs the face's verbs for the buttons; ``jobview``, ``series`` and ``logs`` are what
the pages read beyond the shared job view (artifacts, chart data, log tails; no web imports);
``guard`` decides who may call what; ``pages`` are the HTML shells; ``server`` binds and runs it
with uvicorn. Needs the ``web`` extra: pip install 'phalanx[web]'.
"""
