"""The machine: devices, precisions, GPU cards, the environment, wall-time estimates, process groups."""
