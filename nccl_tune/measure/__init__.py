"""Measuring: grids of settings (grid), what a sweep will do (sweepplan), a sweep's
options to its plan (sweep_request) and the run of that plan (sweep_run), the sweep
engine (sweep) and its search strategies (search), the simulated backend (simbackend),
launchers (launch) and nccl-tests importers (importers).

May import `microbench` (its torch-free options), `nccl_tune.model`, `live`, `nccl` and
the root modules; never spec, decide or commands.
"""
