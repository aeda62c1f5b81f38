"""Secrets: values a job's ranks get in their environment by name (``--secret HF_TOKEN``), kept out
of every record phalanx writes (docs/secrets.md).

- ``base.py``: the ``SecretStore`` interface (set, get, list, remove) and what a secret's name may be;
- ``local.py``: this user's store, a 0600 file under the user's config directory (values in the OS
  keyring when one is there); a team server's table slots in behind the same interface;
- ``resolve.py``: names -> values at the last moment, for the backend that starts the ranks;
- ``mask.py``: the values masked (``********``) in what the ranks print, also across writes.

Records (the store, ``spec.json``, ``plan.json``, launch files, manifests) hold names only.
Nothing is imported here: the bootstrap of every worker imports ``mask`` alone.
"""
