"""Build NCCL's real example tuner plugin and nccl-tune's harness, and query them.

The plugin is compiled from ../shared/fixtures/real/nccl_tuner_example_2.30.7 (NCCL's
plugins/tuner/example, unchanged) with gcc, as its README says; the harness
(tests/tuner_harness/harness.c) calls it the way NCCL core does. Tests skip with a reason
when gcc or the folder is absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REAL_FIXTURES

PLUGIN_DIR = REAL_FIXTURES / "nccl_tuner_example_2.30.7"
HARNESS_C = Path(__file__).resolve().parent / "tuner_harness" / "harness.c"
# ncclFunc_t (the plugin's tuner.h) and NCCL_ALGO_* / NCCL_PROTO_* numbers.
FUNC = {"broadcast": 0, "reduce": 1, "allgather": 2, "reducescatter": 3, "allreduce": 4}
ALGO = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTO = ("ll", "ll128", "simple")


@dataclass(frozen=True)
class Answer:
    """What NCCL core ends up with for one collective after the plugin ran."""

    collective: str
    nbytes: int
    algorithm: str | None
    protocol: str | None
    channels: int  # the plugin's nChannels (0: NCCL's own count)
    applied: bool  # the plugin set a cost-table entry to 0 (a rule matched and was usable)


class Plugin:
    """The built plugin and harness; `query` runs one communicator."""

    def __init__(self, plugin: Path, harness: Path):
        self.plugin, self.harness = plugin, harness

    def query(
        self,
        csv: Path,
        nranks: int,
        nnodes: int,
        probes: list[tuple[str, int]],
        disabled: list[tuple[int, int, int]] = (),
    ) -> list[Answer]:
        """Init a communicator of `nranks`/`nnodes` on `csv`, then getCollInfo per probe."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
        env["NCCL_TUNER_CONFIG_FILE"] = str(csv)
        argv = [
            str(self.harness),
            str(self.plugin),
            str(nranks),
            str(nnodes),
            *(f"{f}:{a}:{p}" for f, a, p in disabled),
        ]
        stdin = "".join(f"{FUNC[c]} {b}\n" for c, b in probes)
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "Loaded" in done.stderr and "tuning configurations" in done.stderr
        names = {v: k for k, v in FUNC.items()}
        out = []
        for line in done.stdout.splitlines():
            func, nbytes, algo, proto, channels, zeroed = line.split()
            out.append(
                Answer(
                    names[int(func)],
                    int(nbytes),
                    ALGO[int(algo)] if int(algo) >= 0 else None,
                    PROTO[int(proto)] if int(proto) >= 0 else None,
                    int(channels),
                    zeroed != "-",
                )
            )
        assert len(out) == len(probes), done.stdout[-2000:]
        return out


def build(folder: Path) -> Plugin:
    """Compile the example plugin and the harness into `folder`; skip without gcc or sources."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not found: cannot build NCCL's example tuner plugin")
    if not (PLUGIN_DIR / "plugin.c").is_file():
        pytest.skip(f"{PLUGIN_DIR} is absent: NCCL's example tuner plugin sources")
    plugin, harness = folder / "libnccl-tuner-example.so", folder / "harness"
    include = str(PLUGIN_DIR / "nccl")
    subprocess.run(
        [gcc, "-O1", "-fPIC", "-shared", "-I", include, "-o", str(plugin), str(PLUGIN_DIR / "plugin.c")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    subprocess.run(
        [gcc, "-O1", "-Wall", "-I", include, "-o", str(harness), str(HARNESS_C), "-ldl"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return Plugin(plugin, harness)
