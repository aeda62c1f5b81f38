"""Cloud VMs of any provider through SkyPilot (``--backend skypilot``). Light: nothing here imports ``sky``."""
