"""An analytical small-message latency model of NCCL collectives on one node.

This is an approximation, not a measurement. It starts from the constants of NCCL's
own cost model (src/graph/tuning.cc, NCCL 2.2x-2.30; DESIGN.md section 5):

    time = baseLat[algo][proto] + hops * hwLat[link][algo][proto]
           + bus_bytes / (channels * bw_per_channel[link] * proto_efficiency)

with hops = 2(n-1) for allreduce (ring, and the intra-node tree chain) and n-1 for
reduce_scatter / all_gather, and bus_bytes the nccl-tests bus traffic
(2(n-1)/n of the message for allreduce, (n-1)/n for the others). LL carries 8 data
bytes per 16-byte line (50%), LL128 120 of 128, Simple all of it.

What NCCL's tables do not give, and this module adds as labelled guesses:
- `shm`: P2P disabled or not allowed across a path, so data moves through host memory;
  per-hop latency several times PCIe's (the public 8x PCIe report gained ~38 us per
  14 KB allreduce from NCCL_P2P_LEVEL=SYS);
- per-channel bandwidths by link, a small per-channel launch cost, NTHREADS scaling
  LL/Simple bandwidth, and BUFFSIZE limiting the bytes a channel moves per step.

NCCL's own choice is modelled too: among the (algo, proto) pairs the environment and
the machine allow, NCCL takes the one its model rates fastest. `simulate` can time
that choice with different ("true") parameters, which is how the sweep's `sim`
backend makes landscapes where a forced setting beats the default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from nccl_tune import settings

LINKS = ("nvlink", "pci", "shm")
STEPS_PER_BUFFER = 8  # NCCL_STEPS: a channel's buffer is split into 8 pipeline slots


def _table(ring: tuple[float, float, float], tree: tuple[float, float, float]) -> dict:
    protos = settings.PROTOCOLS
    out = {("Ring", p): v for p, v in zip(protos, ring)}
    out.update({("Tree", p): v for p, v in zip(protos, tree)})
    return out


@dataclass(frozen=True)
class ModelParams:
    """Constants of the latency model (us, GB/s). Defaults: NCCL's tables plus guesses."""

    # NCCL tuning.cc baseLat, order LL / LL128 / Simple.
    base_lat: dict = field(default_factory=lambda: _table((6.6, 14.0, 8.4), (6.8, 14.0, 8.4)))
    # NCCL tuning.cc hwLat per hop for NVLink and PCI; `shm` is this module's guess.
    hw_lat: dict = field(default_factory=lambda: {
        "nvlink": _table((0.6, 1.9, 3.4), (0.6, 1.25, 4.0)),
        "pci": _table((1.0, 2.5, 5.7), (1.0, 1.9, 4.0)),
        "shm": _table((3.6, 6.0, 8.0), (3.6, 6.0, 8.0)),
    })
    nvls_lat: float = 25.0  # NVLS: ~25 us fixed; never wins small messages
    # GB/s one channel moves over each link (guesses in the range of NCCL's per-arch tables).
    bw_per_channel: dict = field(default_factory=lambda: {"nvlink": 20.0, "pci": 12.0, "shm": 5.0})
    proto_eff: dict = field(default_factory=lambda: {"LL": 0.5, "LL128": 120 / 128, "Simple": 1.0})
    channel_cost_us: float = 0.04  # per extra channel (CTA launch and sync), a guess
    default_nthreads: int = 512

    def perturbed(self, **changes) -> "ModelParams":
        """A copy with some fields replaced (for sim landscapes)."""
        return replace(self, **changes)


NCCL_PARAMS = ModelParams()


@dataclass(frozen=True)
class Topology:
    """A one-node machine as the model sees it."""

    name: str
    link: str  # "nvlink" | "pci"
    p2p_path: str  # farthest GPU-GPU path, as `nvidia-smi topo -m` prints it
    nvswitch: bool = False
    default_channels: int = 2  # channels NCCL's topology search typically finds
    ll128_by_default: bool = False  # NCCL enables LL128 itself only on NVLink machines
    description: str = ""


TOPOLOGIES: dict[str, Topology] = {
    "nvlink": Topology("nvlink", "nvlink", "NV18", nvswitch=True, default_channels=16,
                       ll128_by_default=True,
                       description="GPUs on NVLink/NVSwitch (DGX/HGX class)"),
    "pcie": Topology("pcie", "pci", "PXB", default_channels=2,
                     description="PCIe-only GPUs, P2P enabled between all pairs"),
    "pcie-shm": Topology("pcie-shm", "pci", "SYS", default_channels=2,
                         description="PCIe-only GPUs across CPU sockets: NCCL's default P2P "
                                     "level excludes SYS paths, so data goes through host memory"),
}

# Path order for NCCL_P2P_LEVEL comparisons (NCCL's PATH_* order); legacy integers 0-5.
_PATH_ORDER = {"LOC": 0, "NVL": 1, "NVB": 2, "C2C": 3, "PIX": 4, "PXB": 5, "P2C": 6,
               "PXN": 7, "PHB": 8, "NODE": 8, "SYS": 9}
_LEGACY_LEVEL = {0: "LOC", 1: "PIX", 2: "PXB", 3: "PHB", 4: "SYS", 5: "SYS"}
DEFAULT_P2P_LEVEL = "PXB"  # NCCL's default on PCIe (code: PATH_PXB)


@dataclass(frozen=True)
class Choice:
    """What NCCL would run for one collective and how long it takes (us)."""

    algo: str
    proto: str
    channels: int
    link: str
    time_us: float


def topology(name: str) -> Topology:
    """The named topology; ValueError listing the known ones otherwise."""
    try:
        return TOPOLOGIES[name]
    except KeyError:
        raise ValueError(f"unknown topology '{name}' (known: {', '.join(TOPOLOGIES)})") from None


def effective_link(topo: Topology, env: dict[str, str]) -> str:
    """The link small collectives use: nvlink, pci (P2P) or shm (through host memory)."""
    if env.get("NCCL_P2P_DISABLE") == "1":
        return "shm"
    if topo.link == "nvlink":
        return "nvlink"
    level = env.get("NCCL_P2P_LEVEL", DEFAULT_P2P_LEVEL)
    if level.isdigit():
        level = _LEGACY_LEVEL.get(int(level), "SYS")
    if level not in _PATH_ORDER:  # a wrong-case value: NCCL ignores it
        level = DEFAULT_P2P_LEVEL
    return "pci" if _PATH_ORDER[topo.p2p_path] <= _PATH_ORDER[level] else "shm"


def candidates(topo: Topology, env: dict[str, str], op: str = "allreduce") -> list[tuple[str, str]]:
    """(algo, proto) pairs NCCL may use here under `env`."""
    algos = settings.allowed_algorithms(env.get("NCCL_ALGO"), _func(op))
    protos = settings.allowed_protocols(env.get("NCCL_PROTO"), _func(op))
    if "NCCL_PROTO" not in env and not topo.ll128_by_default:
        protos = protos - {"LL128"}  # off by default on PCIe; forced only by NCCL_PROTO
    out = []
    for algo in ("Ring", "Tree", "NVLS"):
        if algo not in algos:
            continue
        if algo == "NVLS" and not (topo.nvswitch and env.get("NCCL_NVLS_ENABLE", "2") != "0"):
            continue
        if algo == "Tree" and op != "allreduce":
            continue  # NCCL's tree serves allreduce (and broadcast/reduce), not AG/RS
        for proto in settings.PROTOCOLS:
            if proto in protos and not (algo == "NVLS" and proto != "Simple"):
                out.append((algo, proto))
    return out


def _func(op: str) -> str:
    return {"allreduce": "allreduce", "all_gather": "allgather",
            "reduce_scatter": "reducescatter"}.get(op, op)


def bus_factor(op: str, nranks: int) -> float:
    """nccl-tests' bus bandwidth factor: 2(n-1)/n for allreduce, (n-1)/n otherwise."""
    if nranks <= 1:
        return 0.0
    return 2 * (nranks - 1) / nranks if op == "allreduce" else (nranks - 1) / nranks


def _int_env(env: dict[str, str], name: str, default: int) -> int:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return default


def channels_used(nbytes: int, proto: str, max_channels: int, min_channels: int = 1) -> int:
    """Channels NCCL spreads a message over: enough bytes per channel, within bounds."""
    per_channel = {"LL": 8 * 1024, "LL128": 32 * 1024, "Simple": 64 * 1024}[proto]
    wanted = max(1, math.ceil(nbytes / per_channel))
    return max(min(wanted, max_channels), min(min_channels, max_channels), 1)


def op_time_us(op: str, nbytes: int, nranks: int, algo: str, proto: str, link: str,
               channels: int, nthreads: int = 512, buffsize: int = 4 << 20,
               params: ModelParams = NCCL_PARAMS) -> float:
    """Modelled time of one collective (us) for a fixed algorithm, protocol and channels."""
    if nranks <= 1:
        return params.base_lat[("Ring", proto)] if algo != "NVLS" else params.nvls_lat
    hops = 2 * (nranks - 1) if op == "allreduce" else nranks - 1
    if algo == "NVLS":
        latency = params.nvls_lat
    else:
        latency = params.base_lat[(algo, proto)] + hops * params.hw_lat[link][(algo, proto)]
    thread_scale = 1.0 if proto == "LL128" else min(1.0, nthreads / params.default_nthreads)
    bandwidth = channels * params.bw_per_channel[link] * params.proto_eff[proto] * thread_scale
    bus_bytes = nbytes * bus_factor(op, nranks)
    transfer = bus_bytes / (bandwidth * 1e3)  # GB/s = 1e3 bytes/us
    # A message larger than one pipeline slot per channel and peer takes extra steps.
    slot = max(1, buffsize // STEPS_PER_BUFFER) * params.proto_eff[proto]
    per_step = nbytes / (channels * nranks)
    extra_steps = max(0, math.ceil(per_step / slot) - 1)
    step_cost = extra_steps * (params.hw_lat[link][("Ring", proto)] if algo != "NVLS" else 1.0)
    return latency + transfer + step_cost + params.channel_cost_us * (channels - 1)


def _resources(topo: Topology, env: dict[str, str]) -> tuple[int, int, int, int]:
    max_ch = _int_env(env, "NCCL_MAX_NCHANNELS", _int_env(env, "NCCL_MAX_NRINGS", topo.default_channels))
    min_ch = _int_env(env, "NCCL_MIN_NCHANNELS", _int_env(env, "NCCL_MIN_NRINGS", 1))
    max_ch = max(max_ch, min_ch)  # NCCL raises the max to the min
    nthreads = _int_env(env, "NCCL_NTHREADS", NCCL_PARAMS.default_nthreads)
    buffsize = _int_env(env, "NCCL_BUFFSIZE", 4 << 20)
    return max_ch, min_ch, nthreads, buffsize


def choose(op: str, nbytes: int, nranks: int, env: dict[str, str], topo: Topology,
           params: ModelParams = NCCL_PARAMS) -> Choice:
    """NCCL's choice under its own model: the fastest allowed (algo, proto) pair."""
    link = effective_link(topo, env)
    max_ch, min_ch, nthreads, buffsize = _resources(topo, env)
    best: Choice | None = None
    for algo, proto in candidates(topo, env, op):
        channels = channels_used(nbytes, proto, max_ch, min_ch)
        t = op_time_us(op, nbytes, nranks, algo, proto, link, channels, nthreads, buffsize, params)
        if best is None or t < best.time_us:
            best = Choice(algo, proto, channels, link, t)
    if best is None:
        raise ValueError("no algorithm/protocol is allowed by this environment on this topology")
    return best


def simulate(op: str, nbytes: int, nranks: int, env: dict[str, str], topo: Topology,
             true_params: ModelParams = NCCL_PARAMS,
             select_params: ModelParams = NCCL_PARAMS) -> Choice:
    """NCCL's choice (made with `select_params`) timed with `true_params`."""
    picked = choose(op, nbytes, nranks, env, topo, select_params)
    _, _, nthreads, buffsize = _resources(topo, env)
    t = op_time_us(op, nbytes, nranks, picked.algo, picked.proto, picked.link,
                   picked.channels, nthreads, buffsize, true_params)
    return replace(picked, time_us=t)


def latency_us(nbytes: int, nranks: int, topology_name: str, env: dict[str, str] | None = None,
               op: str = "allreduce") -> float:
    """Modelled latency (us) of one collective of `nbytes` under `env` on a named topology."""
    return choose(op, nbytes, nranks, env or {}, topology(topology_name)).time_us
