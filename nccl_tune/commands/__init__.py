"""CLI commands, one module each; loaded lazily by nccl_tune.cli."""
