"""The `sim` backend: measurements drawn from the analytical model, with realistic noise.

Nothing here is measured. A landscape is the cost model (nccl_tune.model.costmodel) on one
topology, optionally with its "true" parameters perturbed away from the ones NCCL
selects with (so NCCL's own choice can be beaten, as on real machines), or flat (every
cell equally fast: no winner should ever be declared). Samples add the noise seen on
real GPUs: per-iteration jitter (log-normal), rare slow outliers (preemption, clock
changes), a drift shared by every cell of a round (thermal, other tenants) and a small
per-launch offset. Draws are seeded by (landscape seed, cell, round, size, iterations),
so a resumed sweep sees the same numbers.

Records say `backend: sim` and `source: modelled`; `effective` reports the model's
choice with `confirmed: null` (nothing was observed). LL128 forced on a PCIe topology
comes back `wrong` (the data corruption NCCL's own LL128 checks avoid), and a
landscape may name broken cells (failed or wrong) to exercise failure handling.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace

import numpy as np

from nccl_tune import stats, store
from nccl_tune.model import costmodel
from nccl_tune.nccl import settings

LANDSCAPES = ("nccl", "perturbed", "flat")


@dataclass(frozen=True)
class Landscape:
    """What the sim backend measures: a model, its noise, and its broken cells."""

    topology: str
    kind: str = "nccl"  # nccl | perturbed | flat
    seed: int = 0
    true_params: costmodel.ModelParams = costmodel.NCCL_PARAMS
    select_params: costmodel.ModelParams = costmodel.NCCL_PARAMS
    noise_cv: float = 0.03  # per-iteration jitter
    spike_prob: float = 0.01  # chance of a slow outlier per iteration
    round_drift: float = 0.01  # sd of a factor shared by all cells of a round
    launch_offset: float = 0.003  # sd of a factor per launch
    broken: dict = field(default_factory=dict)  # cell id -> "failed" | "wrong"
    # Multiplicative effects of single settings on the true latency, NAME -> {value: factor}
    # (tests and benchmarks build landscapes with a known best cell from these).
    effects: dict = field(default_factory=dict)
    # Effects of pairs of settings together: ((NAME, value), (NAME, value), factor) triples
    # (hardware effects that no one-variable-at-a-time search can see alone).
    interactions: tuple = ()
    # A `model fit` file whose constants are the true parameters (None: NCCL's tables);
    # with one, eager records include its fitted launch time.
    calibrated: str | None = None

    def describe(self) -> str:
        """One line saying what this landscape is."""
        what = {
            "nccl": "NCCL's own cost model",
            "flat": "a flat landscape (all cells equal)",
            "perturbed": f"the cost model with perturbed true parameters (seed {self.seed})",
        }
        fitted = f", constants fitted in {self.calibrated}" if self.calibrated else ""
        return f"simulated: {what.get(self.kind, self.kind)}{fitted} on topology '{self.topology}'"


def _scaled(table: dict, rng: np.random.Generator, sd: float) -> dict:
    return {key: value * float(rng.lognormal(0.0, sd)) for key, value in table.items()}


def perturbed_params(
    seed: int, strength: float = 0.25, base: costmodel.ModelParams = costmodel.NCCL_PARAMS
) -> costmodel.ModelParams:
    """The model's constants, each scaled by a random log-normal factor (sd `strength`)."""
    rng = np.random.default_rng(seed)
    return base.perturbed(
        base_lat=_scaled(base.base_lat, rng, strength),
        hw_lat={link: _scaled(table, rng, strength) for link, table in base.hw_lat.items()},
        bw_per_channel=_scaled(base.bw_per_channel, rng, strength),
        channel_cost_us=base.channel_cost_us * float(rng.lognormal(0.0, strength)),
    )


def make_landscape(kind: str, topology: str, seed: int = 0, model=None, **changes) -> Landscape:
    """A landscape by name: 'nccl' (the model as is), 'perturbed' (seeded) or 'flat';
    `model` (calibrate.LoadedModel): its fitted constants are the true parameters."""
    if kind not in LANDSCAPES:
        raise ValueError(f"unknown sim landscape '{kind}' (known: {', '.join(LANDSCAPES)})")
    costmodel.topology(topology)  # validates the name
    land = Landscape(topology=topology, kind=kind, seed=seed)
    base = costmodel.NCCL_PARAMS
    if model is not None:
        base = model.params
        land = replace(land, true_params=base, calibrated=model.path)
    if kind == "perturbed":
        land = replace(land, true_params=perturbed_params(seed, base=base))
    return replace(land, **changes)


def true_choice(
    land: Landscape, env: dict, op: str, nbytes: int, nranks: int, mode: str | None = None
) -> costmodel.Choice:
    """The noiseless latency of a cell: NCCL's choice, timed with the true parameters.

    Raises ValueError when the environment allows no algorithm on this topology.
    """
    topo = costmodel.topology(land.topology)
    mode = mode if land.calibrated else None  # launch time only as a fit measured it
    if land.kind == "flat":  # every cell runs as fast as NCCL's defaults
        choice = (
            costmodel.simulate(op, nbytes, nranks, {}, topo, land.true_params, land.select_params, mode)
            if land.calibrated
            else costmodel.choose(op, nbytes, nranks, {}, topo, land.select_params)
        )
    else:
        choice = costmodel.simulate(op, nbytes, nranks, env, topo, land.true_params, land.select_params, mode)
    factor = math.prod(land.effects.get(name, {}).get(value, 1.0) for name, value in env.items())
    for (name_a, value_a), (name_b, value_b), pair_factor in land.interactions:
        if env.get(name_a) == value_a and env.get(name_b) == value_b:
            factor *= pair_factor
    return replace(choice, time_us=choice.time_us * factor) if factor != 1.0 else choice


def _rng(*parts) -> np.random.Generator:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _factor(sd: float, *parts) -> float:
    return float(math.exp(_rng(*parts).normal(0.0, sd))) if sd > 0 else 1.0


def draw_samples(
    land: Landscape, true_us: float, cell: str, round_: int, nbytes: int, iters: int, launch: str = ""
) -> list[float]:
    """Per-iteration latencies (us) around `true_us` with the landscape's noise."""
    drift = _factor(land.round_drift, land.seed, "round", round_)
    offset = _factor(land.launch_offset, land.seed, "launch", launch, cell, round_)
    rng = _rng(land.seed, "samples", cell, round_, nbytes, iters)
    center = true_us * drift * offset
    values = center * rng.lognormal(0.0, land.noise_cv, size=iters)
    spikes = rng.random(iters) < land.spike_prob
    values[spikes] *= rng.uniform(1.5, 3.0, size=int(spikes.sum()))
    return [float(v) for v in values]


def _forced_ll128_on_pcie(land: Landscape, env: dict) -> bool:
    proto = env.get("NCCL_PROTO")
    return (
        proto is not None and settings.enables_ll128(proto) and not costmodel.topology(land.topology).ll128_by_default
    )


def measure_cell(
    land: Landscape,
    *,
    run_id: str,
    env: dict,
    op: str,
    sizes: list[int],
    nranks: int,
    nnodes: int,
    iters: int,
    dtype: str,
    mode: str,
    round_: int,
    launch: str = "",
    extra: dict | None = None,
) -> list[dict]:
    """One record per size for one cell, as the microbench would write them (simulated)."""
    cell = store.cell_id(env)
    out = []
    for nbytes in sizes:
        fields = dict(
            run_id=run_id,
            cell=cell,
            env=dict(env),
            backend="sim",
            source="modelled",
            op=op,
            mode=mode,
            world_size=nranks,
            nnodes=nnodes,
            bytes=nbytes,
            dtype=dtype,
            iters=iters,
            topology=land.topology,
            round=round_,
            versions={"nccl": None, "torch": None, "cuda": None},
        )
        fields.update(extra or {})
        broken = land.broken.get(cell)
        try:
            choice = true_choice(land, env, op, nbytes, nranks, mode)
        except ValueError as exc:
            out.append(
                store.make_record(**fields, status="failed", correct=None, error=f"simulated: NCCL would fail: {exc}")
            )
            continue
        if broken == "failed":
            out.append(
                store.make_record(
                    **fields, status="failed", correct=None, error="simulated: this landscape marks the cell broken"
                )
            )
            continue
        samples = draw_samples(land, choice.time_us, cell, round_, nbytes, iters, launch)
        summary = stats.summarize(samples)
        p50 = summary["p50"]
        algbw = nbytes / (p50 * 1e3) if p50 else None  # GB/s: bytes / us / 1e3
        forced_ll128 = _forced_ll128_on_pcie(land, env)
        wrong = broken == "wrong" or forced_ll128
        out.append(
            store.make_record(
                **fields,
                lat_us=summary,
                samples_us=samples,
                algbw_gbps=algbw,
                busbw_gbps=algbw * costmodel.bus_factor(op, nranks) if algbw else None,
                correct=not wrong,
                wrong=(max(1, nbytes // 64) if wrong else 0),
                status="wrong" if wrong else "ok",
                error=(
                    None
                    if not wrong
                    else "simulated: results differ from the reference (LL128 forced on PCIe)"
                    if forced_ll128
                    else "simulated: this landscape marks the cell wrong"
                ),
                effective={
                    "algo": choice.algo,
                    "proto": choice.proto,
                    "channels": choice.channels,
                    "confirmed": None,
                    "detail": "simulated: the cost model's choice, not observed",
                },
            )
        )
    return out
