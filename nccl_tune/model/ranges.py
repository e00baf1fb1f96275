"""Where a kind of machine's allreduce latency lies: the model's time, and how far
published machines of the kind fall from it.

A range is not the span some machines measured: it is the model's time for the asked
(kind, settings, size), hence for the algorithm and protocol NCCL runs there, times the
spread that published machines show around the model. For every published table
(nccl_tune.references) each point gives a residual, log(measured / modelled) with the
table's own settings, timer and transport; a machine's residuals give its offset (mean)
and its spread over sizes (variance). The range for a new machine is a prediction
interval over those machines:

    centre = median of the machines' offsets
    half   = t(0.95, m - 1 + B) x sqrt(between x (1 + 1/m) + mean within-machine variance)
    between = ((m - 1) var(offsets) + B var(every machine's offset)) / (m - 1 + B)

(`COVERAGE` = 90% two-sided, Student-t because m, the machines, is small), applied to the
model's time; the spread between machines is pooled with every published machine's as
if `BORROW` (2) more machines of the group showed it, so a few machines that happen to
agree do not make a narrow range. Which machines: those of the kinds the model cannot tell apart from the asked
one here (same link family, same modelled time within 1%: `nvswitch` and `nvswitch-nvls`
share a range wherever NVLS does not change the time); fewer than `MIN_MACHINES` of them:
the link family's (NVLink, PCIe); fewer still: every machine.

What the kind cannot know widens the model's time itself: on PCIe, whether the GPUs can
do P2P at all (GeForce boards without a patched driver cannot, and NCCL then uses host
memory whatever NCCL_P2P_LEVEL says) gives a second time, and the range spans both.

A range is never wider than `MAX_WIDTH` (4x): a wider interval is cut to 4x around its
centre and says so (`capped`). Where the kind's machines themselves differ by more than
`DISAGREE` (3x), the range says so and names the question that splits them (the fact
the most different machines differ in: P2P, sockets, switches, NVLS, the timer).

The honest check is leave-one-machine-out: the range built without a machine, held
against that machine's points (`leave_one_out`, reported by bench/model_truth.py).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from nccl_tune.model import costmodel

WINDOW = (4 << 10, 128 << 10)  # sizes whose residuals build the bands: decode-sized allreduces
CHECK_WINDOW = (8 << 10, 64 << 10)  # the sizes the targets are stated at
COVERAGE = 0.90  # two-sided prediction interval for a machine not in the references
MAX_WIDTH = 4.0  # no range wider than this (high / low)
DISAGREE = 3.0  # machines of one kind differing by more than this: say so, ask the question
MIN_MACHINES = 2
BORROW = 2  # pseudo-machines with every published machine's spread, added to each group's
SAME_TIME = 0.01  # kinds whose modelled times differ by less than this share a range

# The question that splits machines differing in one fact (first that differs wins).
QUESTIONS = {
    "p2p": (
        "is P2P enabled between the GPUs? `nvidia-smi topo -p2p r` (OK on every pair: P2P; "
        "NS/CNS: NCCL goes through host memory)"
    ),
    "sockets": "are any GPU pairs on different CPU sockets (SYS in `nvidia-smi topo -m`)?",
    "pcie_switch": "are all GPU pairs behind PCIe switches (PIX/PXB in `nvidia-smi topo -m`)?",
    "nvls": "does NCCL build NVLS here (NCCL_DEBUG=INFO prints 'NVLS multicast support')?",
}
LINK_QUESTION = (
    "what PCIe link do the GPUs have? `nvidia-smi --query-gpu=pcie.link.gen.current,"
    "pcie.link.width.current --format=csv` (a narrow or slow host link stretches "
    "every transfer)"
)
FACTS = tuple(QUESTIONS)


@dataclass(frozen=True)
class Offset:
    """One published machine's distance from the model: log(measured / modelled)."""

    machine: str
    kinds: tuple
    mean: float
    var: float
    points: int
    facts: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """Measured over modelled, on average over the machine's points."""
        return math.exp(self.mean)


@dataclass(frozen=True)
class Band:
    """Where machines of a group fall around the model (log ratios)."""

    centre: float
    half: float
    offsets: tuple
    basis: str  # which machines: "kind" (kinds the model cannot tell apart) | "family" | "all"
    kinds: tuple

    @property
    def machines(self) -> tuple:
        """The machines the band is built from."""
        return tuple(o.machine for o in self.offsets)

    @property
    def spread(self) -> float:
        """How far apart the most different machines are (ratio of their offsets, >= 1)."""
        means = [o.mean for o in self.offsets]
        return math.exp(max(means) - min(means))

    def question(self) -> str | None:
        """The question that splits the machines, when they differ by more than DISAGREE."""
        if self.spread <= DISAGREE:
            return None
        low = min(self.offsets, key=lambda o: o.mean)
        high = max(self.offsets, key=lambda o: o.mean)
        for fact in FACTS:
            a, b = low.facts.get(fact), high.facts.get(fact)
            if a is not None and b is not None and a != b:
                return QUESTIONS[fact]
        return LINK_QUESTION


@dataclass(frozen=True)
class Range:
    """A modelled time and the range published machines of its kind give it (us)."""

    low: float
    high: float
    model_us: float
    band: Band | None
    capped: bool = False
    calibrated: bool = False
    basis: str = ""

    def covers(self, value: float) -> bool:
        """True when `value` (us) lies in [low, high]."""
        return self.low <= value <= self.high

    @property
    def width(self) -> float:
        """high / low."""
        return self.high / self.low

    @property
    def question(self) -> str | None:
        """The question that splits this kind's machines (None: they agree within DISAGREE)."""
        return self.band.question() if self.band else None

    def rounded(self) -> list[float]:
        """[low, high] to 0.01 us, rounded inwards: never printed wider than it is."""
        return [math.ceil(self.low * 100 - 1e-9) / 100, math.floor(self.high * 100 + 1e-9) / 100]

    def to_dict(self) -> dict:
        """JSON-ready form."""
        band = self.band
        low, high = self.rounded()
        return {
            "low": low,
            "high": high,
            "model_us": round(self.model_us, 2),
            "calibrated": self.calibrated,
            "capped": self.capped,
            "basis": self.basis,
            "machines": list(band.machines) if band else [],
            "kinds": list(band.kinds) if band else [],
            "machines_differ_by": round(band.spread, 2) if band else None,
            "question": self.question,
        }


# ---------------------------------------------------------------- the model for a table


def timer_extra_us(
    mode: str | None, gpus_per_process: int | None, params: costmodel.ModelParams = costmodel.NCCL_PARAMS
) -> float:
    """Host time a timer adds beyond the model's one launch: a process driving N GPUs
    (nccl-tests -g N) launches N kernels one after the other before its timer stops."""
    if mode != "eager" or not gpus_per_process or gpus_per_process <= 1:
        return 0.0
    return params.launch_us * (gpus_per_process - 1)


def model_us(
    kind: str,
    nranks: int,
    nbytes: int,
    env: dict,
    mode: str | None,
    gpus_per_process: int | None = 1,
    p2p: bool | None = None,
    params: costmodel.ModelParams = costmodel.NCCL_PARAMS,
) -> float:
    """The model's time (NCCL's choice, NCCL's constants for selection) under a timer;
    `p2p` False: the GPUs cannot do P2P, so the transport is host memory."""
    env = dict(env)
    if p2p is False:
        env["NCCL_P2P_DISABLE"] = "1"
    choice = costmodel.predict("allreduce", nbytes, nranks, env, costmodel.topology(kind), params, mode=mode)
    return choice.time_us + timer_extra_us(mode, gpus_per_process, params)


def reference_model_us(ref, nbytes: int) -> float:
    """The model's time for a published table's own machine, settings and timer."""
    return model_us(ref.kind, ref.n_gpus, nbytes, ref.env, ref.mode or "eager", ref.gpus_per_process, ref.p2p)


def residuals(ref, window: tuple = WINDOW) -> list[tuple[int, float]]:
    """(bytes, log(measured / modelled)) for a table's points inside `window`."""
    return [(b, math.log(t / reference_model_us(ref, b))) for b, t in ref.points if window[0] <= b <= window[1]]


def offsets(refs, kinds=None, exclude_machine: str | None = None) -> list[Offset]:
    """Each machine's offset from the model (tables whose settings are stated only)."""
    per: dict[str, list] = {}
    for ref in refs:
        if not ref.settings_stated or ref.machine == exclude_machine:
            continue
        if kinds is not None and ref.kind not in kinds:
            continue
        values = [v for _, v in residuals(ref)]
        if values:
            entry = per.setdefault(ref.machine, [[], set(), {}])
            entry[0].extend(values)
            entry[1].add(ref.kind)
            for fact in FACTS:  # a fact that differs between a machine's tables is not its own
                entry[2].setdefault(fact, set()).add(getattr(ref, fact, None))
    return [
        Offset(
            m,
            tuple(sorted(kinds_)),
            statistics.fmean(v),
            statistics.pvariance(v),
            len(v),
            {f: next(iter(vals)) for f, vals in facts.items() if len(vals) == 1},
        )
        for m, (v, kinds_, facts) in sorted(per.items())
    ]


def band(found: list[Offset], basis: str, kinds: tuple, everyone: list[Offset]) -> Band | None:
    """The prediction interval over machines' offsets (None with fewer than MIN_MACHINES).

    The group's spread between machines is pooled with every published machine's
    (`everyone`) as if BORROW more machines of the group showed it: three machines that
    happen to agree do not promise the next one will."""
    m = len(found)
    if m < MIN_MACHINES:
        return None
    from scipy.stats import t as student_t

    means = [o.mean for o in found]
    within = statistics.fmean(o.var for o in found)
    everyone_var = statistics.variance([o.mean for o in everyone]) if len(everyone) > 1 else 0.0
    between = ((m - 1) * statistics.variance(means) + BORROW * everyone_var) / (m - 1 + BORROW)
    sd = math.sqrt(between * (1 + 1 / m) + within)
    half = float(student_t.ppf((1 + COVERAGE) / 2, m - 1 + BORROW)) * sd
    return Band(statistics.median(means), half, tuple(found), basis, kinds)


def family(kind: str) -> str:
    """nvlink | pci: the link a kind's GPUs talk over (kinds.Topology.link)."""
    return costmodel.topology(kind).link


def equivalent_kinds(kind: str, nranks: int, nbytes: int, env: dict, mode: str | None) -> tuple:
    """Kinds of the same link family whose modelled time here is the asked kind's (1%)."""
    target = model_us(kind, nranks, nbytes, env, mode)
    out = []
    for other in costmodel.TOPOLOGIES:
        if family(other) != family(kind):
            continue
        try:
            t = model_us(other, nranks, nbytes, env, mode)
        except ValueError:
            continue
        if abs(t - target) <= SAME_TIME * target:
            out.append(other)
    return tuple(out)


def choose_band(
    refs, kind: str, nranks: int, nbytes: int, env: dict, mode: str | None, exclude_machine: str | None = None
) -> Band | None:
    """The band for a query: kinds the model cannot tell apart, else the family, else all."""
    everyone = offsets(refs, None, exclude_machine)
    same = equivalent_kinds(kind, nranks, nbytes, env, mode)
    found = band(offsets(refs, same, exclude_machine), "kind", same, everyone)
    if found is None:
        fam = tuple(k for k in costmodel.TOPOLOGIES if family(k) == family(kind))
        found = band(offsets(refs, fam, exclude_machine), "family", fam, everyone)
    if found is None:
        found = band(everyone, "all", tuple(costmodel.TOPOLOGIES), everyone)
    return found


def variant_times(
    kind: str,
    nranks: int,
    nbytes: int,
    env: dict,
    mode: str | None,
    gpus_per_process: int | None = 1,
    params: costmodel.ModelParams = costmodel.NCCL_PARAMS,
) -> tuple[float, float]:
    """The model's time on the machines a kind cannot tell apart: (low, high).

    On PCIe, when the settings let NCCL use P2P, the GPUs may still not support it
    (host memory instead): both times. NVLink kinds: one time.
    """
    first = model_us(kind, nranks, nbytes, env, mode, gpus_per_process, None, params)
    topo = costmodel.topology(kind)
    if topo.link != "pci" or costmodel.effective_link(topo, env) == "shm":
        return first, first
    other = model_us(kind, nranks, nbytes, env, mode, gpus_per_process, False, params)
    return min(first, other), max(first, other)


def kind_range(
    refs,
    kind: str,
    nranks: int,
    nbytes: int,
    env: dict | None = None,
    mode: str | None = None,
    gpus_per_process: int | None = 1,
    exclude_machine: str | None = None,
) -> Range | None:
    """The range for `kind` at `nbytes` under `env` (None: no published machine at all)."""
    env = dict(env or {})
    found = choose_band(refs, kind, nranks, nbytes, env, mode, exclude_machine)
    if found is None:
        return None
    t_lo, t_hi = variant_times(kind, nranks, nbytes, env, mode, gpus_per_process)
    low, high = t_lo * math.exp(found.centre - found.half), t_hi * math.exp(found.centre + found.half)
    capped = high / low > MAX_WIDTH
    if capped:
        mid = math.sqrt(low * high)
        low, high = mid / math.sqrt(MAX_WIDTH), mid * math.sqrt(MAX_WIDTH)
    basis = {
        "kind": f"published machines of kind {'/'.join(found.kinds)}",
        "family": f"published {family(kind)} machines (too few of kind {kind})",
        "all": "every published machine (too few of this link)",
    }[found.basis]
    return Range(low, high, t_lo if t_lo == t_hi else math.sqrt(t_lo * t_hi), found, capped, False, basis)


# ---------------------------------------------------------------- leave one machine out


@dataclass(frozen=True)
class Check:
    """One published point against the range built without its machine."""

    name: str
    machine: str
    kind: str
    nbytes: int
    measured_us: float
    range: Range | None

    @property
    def covered(self) -> bool | None:
        """True/False; None when no range could be built."""
        return None if self.range is None else self.range.covers(self.measured_us)


def leave_one_out(refs, window: tuple = CHECK_WINDOW, defaults_only: bool = False) -> list[Check]:
    """Every stated point in `window`, held against its kind's range built without its machine."""
    out = []
    for ref in refs:
        if not ref.settings_stated or (defaults_only and ref.env):
            continue
        for nbytes, measured in ref.points:
            if window[0] <= nbytes <= window[1]:
                found = kind_range(
                    refs,
                    ref.kind,
                    ref.n_gpus,
                    nbytes,
                    ref.env,
                    ref.mode or "eager",
                    ref.gpus_per_process,
                    exclude_machine=ref.machine,
                )
                out.append(Check(ref.name, ref.machine, ref.kind, nbytes, measured, found))
    return out
