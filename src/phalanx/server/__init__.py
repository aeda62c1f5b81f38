"""The team server (``phalanx server``): the face (``phalanx.api``) behind HTTP under ``/api/v1``
for every logged-in user, the dashboard with a login page, ``/healthz`` and ``/metrics``.
``docs/server.md`` says how to run it and what it keeps."""
