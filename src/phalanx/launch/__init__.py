"""How one node runs its part of a job: the node agent, torchrun argv, the worker bootstrap."""
