"""Models of time: NCCL's small-message latency (costmodel, kinds of machines), the
per-token cost of collectives (per_token), calibration to one machine (calibrate),
published measurements (references, shipped in nccl_tune/data) and the ranges they give
the model's times (ranges), and which allreduce path an inference engine takes (engines).

Pure functions, no torch. May import `nccl_tune.live`, `nccl_tune.nccl` and the root
modules.
"""
