"""The face of phalanx: every verb and every view, the one thing the CLI, the dashboard and the
server call.

- Views (``query``, ``lists``, ``ps``, ``jobview``, ``sweepview``) read the store and the job
  directories and never act: no view imports a verb or the face (``tests/unit/test_layers.py``
  checks it).
- Verbs (``jobs``: run, submit, resume, stop, wait, sweeps' verbs; ``cleanup``: rm and prune) act
  on jobs through ``supervise`` and may use the views.
- ``face``: ``Face``, the contract that puts every verb and view behind one object, and
  ``LocalFace``, which serves it from this machine's store; ``cli/face.py`` hands it to the CLI.
"""
