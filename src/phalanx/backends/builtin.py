"""Where the built-in backends live (``name -> "module:Class"``): ``registry.BUILTIN``, and what
``backends/options.py`` reads to find their options modules without importing the registry
(which imports the backend interface, which imports the options). Pure data; no imports."""

BACKENDS: dict[str, str] = {
    "local": "phalanx.backends.local:LocalBackend",
    "ssh": "phalanx.backends.ssh:SshBackend",
    "slurm": "phalanx.backends.slurm.backend:SlurmBackend",
    "sagemaker": "phalanx.backends.sagemaker.backend:SageMakerBackend",
    "skypilot": "phalanx.backends.skypilot.backend:SkyPilotBackend",
    "ray": "phalanx.backends.ray.backend:RayBackend",
    "k8s": "phalanx.backends.kubernetes.backend:KubernetesBackend",
}

# Backends that may run a job's supervisor themselves, away from this machine (``Backend.host_supervisor``):
# asked for a job id this home never saw, and by ``phalanx ps --backend NAME``.
HOSTS_SUPERVISORS: tuple[str, ...] = ("k8s",)
