"""The dashboard (``phalanx ui``): a read-only view over the store and the job directories.

``data`` reads (no web imports), ``app`` is the Starlette application (JSON API + pages),
``server`` binds and runs it with uvicorn. Needs the ``web`` extra: pip install 'phalanx[web]'.
"""
