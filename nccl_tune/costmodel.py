"""An analytical small-message latency model of NCCL collectives on one node.

This is an approximation, not a measurement. Sources:

- NCCL src/graph/tuning.cc (2.2x-2.30), `ncclTopoTuneModel` and `ncclTopoGetAlgoTime`:
  baseLat (Tree 6.8/14.0/8.4, Ring 6.6/14.0/8.4 us for LL/LL128/Simple), hwLat per hop
  for NVLink (Tree .6/1.25/4.0, Ring .6/1.9/3.4) and PCI (Tree 1.0/1.9/4.0, Ring
  1.0/2.5/5.7), NVLS 25 us on one node; one-node allreduce latency
  `baseLat + 2(n-1) * hwLat` for Ring and for the intra-node Tree chain; bandwidth
  refinements (Ring LL x0.5, Ring LL128 x0.92; Tree x0.92, Tree LL /3.8, Tree LL128
  x7/9 on one node; Ring algorithm bandwidth = bus bandwidth x n/nsteps, Tree x0.5) and
  Tree's per-size correction factors; `time = latency + bytes / (1000 * bandwidth)`.
- NCCL src/enqueue.cc, `topoGetAlgoInfo`: how many channels and threads a collective
  really uses: start from the communicator's channels and the (algo, proto) thread
  maximum, then drop channels, then halve threads, while
  `bytes < channels * threads * threshold` (thresholds: LL 8 x nRanks for Ring, LL128
  8, Simple 64 bytes per thread). A 14 KB Ring/LL allreduce on 8 ranks runs on 1 channel.
- NCCL src/graph/paths.cc, `ncclTopoCheckP2p`: P2P is used up to path type PXB by
  default (NCCL_P2P_LEVEL overrides; NCCL_P2P_DISABLE=1 means LOC); farther pairs go
  through host shared memory (SHM).
- LL128 is enabled by default only where the intra-node graph is NVLink; any
  NCCL_PROTO that names LL128 forces it (DESIGN.md section 5).

Two views of the same machine, because NCCL cannot see everything:
- NCCL's choice (`choose`, `simulate`'s selection) uses NCCL's own view: the hardware
  is NVLink or PCI, never SHM (tuning.cc has no SHM latency), and bandwidth uses the
  communicator's channel pool.
- The time a collective takes (`op_time_us`) uses the transport really in use (SHM is
  far slower per hop than P2P) and the channels and threads it really runs with.

What NCCL's tables do not give, and this module adds as labelled guesses:
- `shm` per-hop latencies (PCI's plus 2.5 us) and bandwidth (5 GB/s per channel): chosen
  so that P2P over SYS paths saves about 38 us per 14 KB allreduce on 8 ranks, the
  public 8x PCIe report's figure for NCCL_P2P_LEVEL=SYS. That agreement is by
  construction, not evidence.
- per-channel bandwidths by link, a small per-channel launch cost, throughput scaling
  with a CTA's maximum threads (NCCL_NTHREADS) up to 512, and NCCL_BUFFSIZE limiting
  the bytes one Simple pipeline slot carries.

`simulate` can time NCCL's choice with different ("true") parameters from those NCCL
selects with, which is how the sweep's `sim` backend makes landscapes where a forced
setting beats the default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from nccl_tune import settings

LINKS = ("nvlink", "pci", "shm")
STEPS_PER_BUFFER = 8  # NCCL_STEPS: a channel's Simple buffer is split into 8 pipeline slots
DEFAULT_BUFFSIZE = 4 << 20  # NCCL's default NCCL_BUFFSIZE
LL128_MAX_NTHREADS = 640  # NCCL_LL128_MAX_NTHREADS
# Bytes per thread before NCCL adds threads/channels (enqueue.cc; NCCL_*_THREAD_THRESHOLD).
THREAD_THRESHOLDS = {"LL": 8, "LL128": 8, "Simple": 64}
# tuning.cc treeCorrectionFactor, powers of two from 64 B (index log2(bytes/64)), 2.2x+.
_TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9,
           1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9),
}


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
    # NCCL tuning.cc hwLat per hop for NVLink and PCI; `shm` is this module's guess (see doc).
    hw_lat: dict = field(default_factory=lambda: {
        "nvlink": _table((0.6, 1.9, 3.4), (0.6, 1.25, 4.0)),
        "pci": _table((1.0, 2.5, 5.7), (1.0, 1.9, 4.0)),
        # PCI + 2.5 us per hop: see the module doc for how this guess was chosen.
        "shm": _table((3.5, 5.0, 8.2), (3.5, 4.4, 6.5)),
    })
    nvls_lat: float = 25.0  # tuning.cc hwLat[NVLINK][NVLS][Simple]; never wins small messages
    # GB/s one channel moves over each link (guesses in the range of NCCL's bwIntra).
    bw_per_channel: dict = field(default_factory=lambda: {"nvlink": 20.0, "pci": 12.0, "shm": 5.0})
    # Ring bandwidth factor per protocol (tuning.cc: LL x0.5, LL128 x0.92).
    proto_eff: dict = field(default_factory=lambda: {"LL": 0.5, "LL128": 0.92, "Simple": 1.0})
    # Tree bandwidth factor per protocol on one node (tuning.cc: x0.92, then LL /3.8, LL128 x7/9).
    tree_eff: dict = field(default_factory=lambda: {"LL": 0.92 / 3.8, "LL128": 0.92 * 7 / 9,
                                                    "Simple": 0.92})
    # Cap on Ring/Tree LL bus bandwidth (tuning.cc llMaxBws, one node: Ampere 87.7, Hopper 141).
    ll_max_bw: float = 87.7
    channel_cost_us: float = 0.04  # per extra channel (CTA launch and sync), a guess
    default_nthreads: int = 512  # threads at which a CTA's throughput is taken as full, a guess

    def perturbed(self, **changes) -> "ModelParams":
        """A copy with some fields replaced (for sim landscapes)."""
        return replace(self, **changes)


NCCL_PARAMS = ModelParams()


@dataclass(frozen=True)
class Topology:
    """A one-node machine as the model sees it."""

    name: str
    link: str  # "nvlink" | "pci": what NCCL's tuning model calls the intra-node hardware
    p2p_path: str  # farthest GPU-GPU path, as `nvidia-smi topo -m` / NCCL print it
    nvswitch: bool = False
    default_channels: int = 2  # channels NCCL's topology search typically finds
    ll128_by_default: bool = False  # NCCL enables LL128 itself only on NVLink machines
    description: str = ""


TOPOLOGIES: dict[str, Topology] = {
    "nvlink": Topology("nvlink", "nvlink", "NVL", nvswitch=True, default_channels=16,
                       ll128_by_default=True,
                       description="GPUs on NVLink/NVSwitch (DGX/HGX class)"),
    "pcie": Topology("pcie", "pci", "PXB", default_channels=2,
                     description="PCIe-only GPUs, P2P enabled between all pairs"),
    "pcie-shm": Topology("pcie-shm", "pci", "SYS", default_channels=2,
                         description="PCIe-only GPUs across CPU sockets: NCCL's default P2P "
                                     "level excludes SYS paths, so data goes through host memory"),
}

# Path order for NCCL_P2P_LEVEL comparisons (NCCL's PATH_* order); legacy integers 0-5
# map through NCCL's levelsOldToNew. NODE is nvidia-smi's name for a PHB-class path.
_PATH_ORDER = {"LOC": 0, "NVL": 1, "NVB": 2, "C2C": 3, "PIX": 4, "PXB": 5, "P2C": 6,
               "PXN": 7, "PHB": 8, "NODE": 8, "SYS": 9}
_LEGACY_LEVEL = {0: "LOC", 1: "PIX", 2: "PXB", 3: "PHB", 4: "SYS", 5: "SYS"}
DEFAULT_P2P_LEVEL = "PXB"  # NCCL's default (paths.cc: PATH_PXB; AMD with <= 2 GPUs: SYS)


@dataclass(frozen=True)
class Choice:
    """What NCCL would run for one collective and how long it takes (us)."""

    algo: str
    proto: str
    channels: int
    link: str
    time_us: float
    nthreads: int = 0  # threads per channel NCCL launches for this size (0: not modelled)


# The machine the model assumes when none is given or detected: the public 8x PCIe report's
# (P2P between CPU sockets through host memory). One default for recommend, validate and
# the sim sweep (resolve_topology).
DEFAULT_TOPOLOGY = "pcie-shm"


def resolve_topology(choice: str) -> tuple[str, str]:
    """(topology name, how it was found) for a --topology choice ('auto' detects); without
    a detected machine, DEFAULT_TOPOLOGY, said to be ASSUMED. recommend and validate (and
    the sim sweep) model the same machine by default because they all ask here."""
    if choice != "auto":
        return choice, f"{choice} (--topology)"
    try:
        from nccl_tune import topology as topo_mod  # helper module; may be absent or fail

        kind = topo_mod.detect_kind()
    except ImportError:
        reason = "topology detection is not available in this install"
    except Exception as exc:  # detection is best effort: never let it stop a recommendation
        reason = f"topology detection failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    else:
        if isinstance(kind, str) and kind in TOPOLOGIES:
            return kind, f"{kind} (detected)"
        reason = "no GPU found" if not kind else f"detected '{kind}', which the model does not know"
    return DEFAULT_TOPOLOGY, (
        f"{DEFAULT_TOPOLOGY} ASSUMED ({reason}): the public 8x PCIe report's machine, where "
        "NCCL's default P2P level sends traffic between GPUs on different CPU sockets through "
        "host memory; pass --topology nvlink|pcie|pcie-shm to model another machine")


def topology(name: str) -> Topology:
    """The named topology; ValueError listing the known ones otherwise."""
    try:
        return TOPOLOGIES[name]
    except KeyError:
        raise ValueError(f"unknown topology '{name}' (known: {', '.join(TOPOLOGIES)})") from None


def effective_link(topo: Topology, env: dict[str, str]) -> str:
    """The transport small collectives use: nvlink, pci (P2P) or shm (through host memory)."""
    if env.get("NCCL_P2P_DISABLE", "").strip() == "1":
        return "shm"
    level = env.get("NCCL_P2P_LEVEL")
    if level is None:
        level = DEFAULT_P2P_LEVEL
    elif level.strip().isdigit():
        level = _LEGACY_LEVEL.get(min(int(level), 5))
    elif level not in _PATH_ORDER:  # wrong case or unknown: NCCL ignores it
        level = DEFAULT_P2P_LEVEL
    if _PATH_ORDER[topo.p2p_path] > _PATH_ORDER[level]:
        return "shm"
    return "nvlink" if topo.link == "nvlink" else "pci"


def _selection_link(topo: Topology) -> str:
    # tuning.cc knows NVLink and PCI only: SHM transport is costed as PCI.
    return "nvlink" if topo.link == "nvlink" else "pci"


def _proto_explicit(value: str | None, func: str) -> bool:
    """True when an NCCL_PROTO value decides the protocols of `func` (else NCCL's defaults)."""
    if not value:
        return False
    try:
        table = settings.parse_coll_list(value, settings.PROTOCOLS, "protocol")
    except settings.SettingError:
        return False  # NCCL rejects it; the lint reports it
    return func in table or "*" in table


def candidates(topo: Topology, env: dict[str, str], op: str = "allreduce") -> list[tuple[str, str]]:
    """(algo, proto) pairs NCCL may use here under `env`."""
    func = _func(op)
    algos = settings.allowed_algorithms(env.get("NCCL_ALGO"), func)
    protos = settings.allowed_protocols(env.get("NCCL_PROTO"), func)
    if not _proto_explicit(env.get("NCCL_PROTO"), func) and not topo.ll128_by_default:
        protos = protos - {"LL128"}  # off by default without NVLink; forced only by NCCL_PROTO
    out = []
    for algo in ("Ring", "Tree", "NVLS"):
        if algo not in algos:
            continue
        if algo == "NVLS" and not (topo.nvswitch and env.get("NCCL_NVLS_ENABLE", "2") != "0"):
            continue
        if algo == "Tree" and op != "allreduce":
            continue  # NCCL's tree serves allreduce only among these collectives
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
        return int(env[name], 0)
    except (KeyError, ValueError):
        return default


def max_threads(algo: str, proto: str, link: str, env: dict[str, str]) -> int:
    """Threads per channel NCCL allows for (algo, proto): tuning.cc's maxThreads.

    LL and Simple take NCCL_NTHREADS (64-512, multiple of 32); LL128 takes
    NCCL_LL128_NTHREADS (default 640). Ring/Simple defaults to 256 on PCIe machines.
    """
    if proto == "LL128":
        nt = _int_env(env, "NCCL_LL128_NTHREADS", LL128_MAX_NTHREADS)
        return nt if 160 <= nt <= LL128_MAX_NTHREADS and nt % 32 == 0 else LL128_MAX_NTHREADS
    default = 256 if (algo == "Ring" and proto == "Simple" and link != "nvlink") else 512
    nt = _int_env(env, "NCCL_NTHREADS", default)
    if nt <= 0:
        return default
    if nt % 32:
        return 512  # NCCL warns and uses the maximum
    return min(max(nt, 64), 512)


def channels_used(nbytes: int, proto: str, max_channels: int, min_channels: int = 1,
                  algo: str = "Ring", nranks: int = 8, nthreads: int = 512) -> int:
    """Channels NCCL runs a collective of `nbytes` on (enqueue.cc's reduction loop)."""
    return launch_shape(nbytes, algo, proto, _pool(max_channels, min_channels), nthreads, nranks)[0]


def launch_shape(nbytes: int, algo: str, proto: str, pool: int, nthreads: int,
                 nranks: int) -> tuple[int, int]:
    """(channels, threads) NCCL launches: fewer channels, then fewer threads, for small sizes."""
    if algo == "NVLS":
        return max(1, pool), 512
    threshold = THREAD_THRESHOLDS[proto] * (nranks if (algo == "Ring" and proto == "LL") else 1)
    nc, nt = max(1, pool), nthreads
    while nbytes < nc * nt * threshold and nc >= 2:
        nc -= 1
    while nbytes < nc * nt * threshold and nt % 128 == 0:
        nt //= 2
    return nc, max(nt, 96)


def _pool(max_channels: int, min_channels: int) -> int:
    return max(1, max(min_channels, 1) if max_channels < min_channels else max_channels)


def latency_term_us(op: str, nranks: int, algo: str, proto: str, link: str,
                    params: ModelParams = NCCL_PARAMS) -> float:
    """The fixed part of a collective's time: baseLat + hops x hwLat (NVLS: its own)."""
    if algo == "NVLS":
        return params.nvls_lat
    hops = 2 * (nranks - 1) if op == "allreduce" else nranks - 1
    return params.base_lat[(algo, proto)] + hops * params.hw_lat[link][(algo, proto)]


def _alg_bandwidth(op: str, nranks: int, algo: str, proto: str, link: str, channels: int,
                   params: ModelParams) -> float:
    """Algorithm bandwidth (GB/s) = bus bandwidth x NCCL's algorithm ratio."""
    per_channel = params.bw_per_channel[link]
    if algo == "Tree":
        bus = channels * per_channel * params.tree_eff[proto]
        return (min(bus, params.ll_max_bw) if proto == "LL" else bus) * 0.5
    if algo == "NVLS":
        return channels * per_channel * 5.0 / 6.0
    bus = channels * per_channel * params.proto_eff[proto]
    if proto == "LL":
        bus = min(bus, params.ll_max_bw)
    return bus / max(bus_factor(op, nranks), 1e-9)


def op_time_us(op: str, nbytes: int, nranks: int, algo: str, proto: str, link: str,
               channels: int, nthreads: int = 512, buffsize: int = DEFAULT_BUFFSIZE,
               params: ModelParams = NCCL_PARAMS, pool: int | None = None) -> float:
    """Modelled time of one collective (us) launched on `channels`, CTAs of up to `nthreads`.

    latency (baseLat + hops x hwLat) + bytes / algorithm bandwidth of the communicator's
    `pool` of channels (default: `channels`; NCCL launches fewer channels only where their
    bandwidth is not needed, so the pool's is used, as NCCL's own model does), where a CTA
    with fewer than `params.default_nthreads` threads moves proportionally less (a guess),
    plus a small cost per launched channel beyond the first and, for Simple, one hop
    latency per pipeline slot beyond the first when NCCL_BUFFSIZE is small. Non-decreasing
    in `nbytes` for a fixed (algo, proto).
    """
    if nranks <= 1:
        return params.base_lat[("Ring", proto)] if algo != "NVLS" else params.nvls_lat
    pool = max(pool or channels, channels)
    latency = latency_term_us(op, nranks, algo, proto, link, params)
    thread_scale = 1.0 if proto == "LL128" else min(1.0, nthreads / params.default_nthreads)
    bandwidth = _alg_bandwidth(op, nranks, algo, proto, link, pool, params) * thread_scale
    transfer = nbytes / (bandwidth * 1e3)  # GB/s = 1e3 bytes/us
    step_cost = 0.0
    if proto == "Simple" and algo != "NVLS":
        # NCCL_BUFFSIZE only sizes the Simple protocol's buffer (LL/LL128 have their own).
        slot = max(1, buffsize // STEPS_PER_BUFFER)
        per_step = nbytes / (pool * nranks)
        step_cost = max(0, math.ceil(per_step / slot) - 1) * params.hw_lat[link][(algo, proto)]
    return latency + transfer + step_cost + params.channel_cost_us * (channels - 1)


def nccl_estimate_us(op: str, nbytes: int, nranks: int, algo: str, proto: str, topo: Topology,
                     pool: int, params: ModelParams = NCCL_PARAMS) -> float:
    """NCCL's own time estimate for (algo, proto): what its selection compares.

    Uses NCCL's view of the hardware (NVLink or PCI, never SHM), the channel pool (not
    the channels finally launched) and tuning.cc's tree correction factors.
    """
    link = _selection_link(topo)
    latency = latency_term_us(op, nranks, algo, proto, link, params)
    bandwidth = _alg_bandwidth(op, nranks, algo, proto, link, pool, params)
    if algo == "Tree":
        log_size = int(math.log2(nbytes >> 6)) if nbytes >= 64 else -1
        if 0 <= log_size < len(_TREE_CORRECTION[proto]):
            bandwidth *= _TREE_CORRECTION[proto][log_size]
    return latency + nbytes / (bandwidth * 1e3)


@dataclass(frozen=True)
class _Resources:
    pool: int
    buffsize: int


def _resources(topo: Topology, env: dict[str, str]) -> _Resources:
    max_ch = _int_env(env, "NCCL_MAX_NCHANNELS", _int_env(env, "NCCL_MAX_NRINGS", 64))
    min_ch = _int_env(env, "NCCL_MIN_NCHANNELS", _int_env(env, "NCCL_MIN_NRINGS", 0))
    # The topology search finds `default_channels`; MIN raises and MAX caps the pool.
    pool = min(max(topo.default_channels, min_ch), max(max_ch, 1))
    if min_ch > max_ch:
        pool = min_ch  # NCCL raises the max to the min
    buffsize = _int_env(env, "NCCL_BUFFSIZE", DEFAULT_BUFFSIZE)
    return _Resources(max(1, pool), buffsize if buffsize > 0 else DEFAULT_BUFFSIZE)


def channel_pool(topo: Topology, env: dict[str, str]) -> int:
    """Channels the communicator holds under `env` (before the per-size reduction)."""
    return _resources(topo, env).pool


def _time_choice(op: str, nbytes: int, nranks: int, algo: str, proto: str, topo: Topology,
                 env: dict[str, str], res: _Resources, params: ModelParams) -> Choice:
    link = effective_link(topo, env)
    nt_max = max_threads(algo, proto, link, env)
    channels, nthreads = launch_shape(nbytes, algo, proto, res.pool, nt_max, nranks)
    t = op_time_us(op, nbytes, nranks, algo, proto, link, channels, nt_max, res.buffsize, params,
                   pool=res.pool)
    return Choice(algo, proto, channels, link, t, nthreads)


def choose(op: str, nbytes: int, nranks: int, env: dict[str, str], topo: Topology,
           params: ModelParams = NCCL_PARAMS) -> Choice:
    """NCCL's choice under its own model, timed with the same parameters on the real transport."""
    return simulate(op, nbytes, nranks, env, topo, params, params)


def simulate(op: str, nbytes: int, nranks: int, env: dict[str, str], topo: Topology,
             true_params: ModelParams = NCCL_PARAMS,
             select_params: ModelParams = NCCL_PARAMS) -> Choice:
    """NCCL's choice (made with `select_params`, NCCL's view) timed with `true_params`."""
    res = _resources(topo, env)
    pairs = candidates(topo, env, op)
    if not pairs:
        raise ValueError("no algorithm/protocol is allowed by this environment on this topology")
    algo, proto = min(pairs, key=lambda ap: nccl_estimate_us(op, nbytes, nranks, ap[0], ap[1], topo,
                                                             res.pool, select_params))
    return _time_choice(op, nbytes, nranks, algo, proto, topo, env, res, true_params)


def latency_us(nbytes: int, nranks: int, topology_name: str, env: dict[str, str] | None = None,
               op: str = "allreduce") -> float:
    """Modelled latency (us) of one collective of `nbytes` under `env` on a named topology."""
    return choose(op, nbytes, nranks, env or {}, topology(topology_name)).time_us


def fastest(op: str, nbytes: int, nranks: int, env: dict[str, str], topo: Topology,
            params: ModelParams = NCCL_PARAMS) -> Choice:
    """The allowed (algo, proto) this model times fastest (not necessarily NCCL's pick)."""
    res = _resources(topo, env)
    pairs = candidates(topo, env, op)
    if not pairs:
        raise ValueError("no algorithm/protocol is allowed by this environment on this topology")
    timed = [_time_choice(op, nbytes, nranks, a, p, topo, env, res, params) for a, p in pairs]
    return min(timed, key=lambda c: c.time_us)
