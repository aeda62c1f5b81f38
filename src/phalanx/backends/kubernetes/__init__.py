"""The Kubernetes backend (``--backend k8s``): see ``backend.py``.

Nothing is imported here: ``pod.py`` runs inside pods whose image has only python3 and the
user's framework, and the CLI reads ``options.py`` without loading the rest.
"""
