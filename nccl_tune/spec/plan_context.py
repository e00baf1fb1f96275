"""What spec-plan adds around the planner: the NCCL profile's variables, comm(n) from
the cost model for --layers (MODELLED), and the serving engine's path for each verify
allreduce, each read as recommend and validate read them."""

from __future__ import annotations

from nccl_tune.model.per_token import Workload

ASSUMED_KIND = "pcie-shm"  # the machine comm(n) and the engine's path assume without --topology


def profile_env(profile_path: str | None) -> dict | None:
    """The NCCL profile's variables (its engine switches apply to the engine's path)."""
    if not profile_path:
        return None
    from nccl_tune.live.profile import load_profile, resolve_profile

    return dict(load_profile(str(resolve_profile(profile_path))).env)


def engine_path(
    engine: str, topology: str | None, workload: Workload, steps: list[int], cc: str | None, env: dict | None
) -> tuple[list[str], dict]:
    """The engine's path for each verify allreduce of k+1 tokens (nccl_tune.model.engines.report:
    the installed engine, else the cited rules): note lines and the report's JSON."""
    from nccl_tune.model import engines
    from nccl_tune.model import per_token as model

    kind = topology or ASSUMED_KIND
    sizes = [model.message_bytes(k + 1, workload.hidden, workload.dtype) for k in [0, *steps]]
    report = engines.report(engine, kind, workload.tp, sizes, cc=cc, env=env, dtype=workload.dtype)
    lines = list(report.lines)
    if engine != "none":
        if topology is None:
            lines.insert(0, f"engine {engine}: machine kind {kind} ASSUMED (pass --topology for yours)")
        lines.append(f"(sizes: verify of k+1 tokens at hidden {workload.hidden}, {workload.dtype})")
    return lines, {"name": engine, **report.to_dict()}


def modelled_comm(workload: Workload, topology: str | None, env: dict | None):
    """comm(n) MODELLED for --layers (nccl_tune.spec.verify.modelled_comm) and its note, or
    (None, None) without --layers; ValueError for inputs the cost model refuses."""
    if not workload.layers:
        return None, None
    from nccl_tune.spec import verify as spec_verify

    kind = topology or ASSUMED_KIND
    return spec_verify.modelled_comm(workload.layers, workload.hidden, workload.dtype, workload.tp, kind, env)


def comm_model(comm, result, workload: Workload, topology: str | None, env: dict | None) -> dict | None:
    """comm(n)'s per-allreduce time, range and calibration at the token counts the plan
    priced (None when the verify model does not use comm(n))."""
    if comm is None or not result.verify_model.get("comm"):
        return None
    from nccl_tune.spec import verify as spec_verify

    tokens = {b.batch * (p.k + 1) for b in result.batches for p in b.plans if p.k > 0}
    kind = topology or ASSUMED_KIND
    return spec_verify.comm_ranges(
        comm, workload.layers, workload.hidden, workload.dtype, workload.tp, kind, env, tokens
    )
