"""NCCL conf files: written in NCCL's syntax, read back as NCCL reads them, reported by check."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import subprocess_env

from nccl_tune.cli import cli
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import conffile, procenv, profile

ENV = {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16"}


def test_conf_text_reads_back_as_nccl_reads_it_and_as_a_profile():
    text = conffile.render_conf(ENV, {"source": "measured", "saving": "4.6 ms per token"})
    assert conffile.read_like_nccl(text) == ENV
    assert profile.parse_profile(text).env == ENV  # also a valid nccl-tune profile
    assert "# saving: 4.6 ms per token" in text
    assert all(line.startswith("#") or "=" not in line or " " not in line for line in text.splitlines())


def test_nccl_reading_rules():
    # No trimming, no quote removal, first line of a name wins, '#' only in column 0.
    text = 'NCCL_A = 1\nNCCL_B="x"\nNCCL_C=1\nNCCL_C=2\n # NCCL_D=3\n#NCCL_E=4\nno equals\r\n'
    assert conffile.read_like_nccl(text) == {"NCCL_A ": " 1", "NCCL_B": '"x"', "NCCL_C": "1", " # NCCL_D": "3"}


@pytest.mark.parametrize(
    "env, words", [({"TORCH_NCCL_X": "1"}, "not an NCCL variable"), ({"NCCL_CONF_FILE": "/x"}, "never read")]
)
def test_what_a_conf_file_cannot_carry_is_refused(env, words):
    with pytest.raises(NcclTuneError, match=words):
        conffile.render_conf(env)


def test_profiles_convert_to_conf(tmp_path, cli_runner):
    src = tmp_path / "p.env"
    src.write_text(profile.render_profile(ENV, {"source": "measured"}))
    out = tmp_path / "p.conf"
    result = cli_runner.invoke(cli, ["profiles", "convert", str(src), "--to", "conf", "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert conffile.read_like_nccl(text) == ENV and "# source: measured" in text
    assert f"# converted: from {src}" in text
    printed = cli_runner.invoke(cli, ["profiles", "convert", str(src), "--to", "conf"])
    assert printed.stdout == text
    assert printed.stderr.startswith(f"converted {src} (checked against NCCL ")
    bad = tmp_path / "bad.env"
    bad.write_text("NCCL_PROTO=LL\nOTHER_VAR=1\n")
    result = cli_runner.invoke(cli, ["profiles", "convert", str(bad), "--to", "conf"])
    assert result.exit_code == 2 and "OTHER_VAR" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_recommend_export_conf_matches_the_env_export(tmp_path, cli_runner):
    env_out, conf_out = tmp_path / "p.env", tmp_path / "p.conf"
    args = ["recommend", "--layers", "61", "--topology", "pcie-shm", "--force"]
    result = cli_runner.invoke(cli, args + ["--export", str(env_out), "--export-conf", str(conf_out)])
    assert result.exit_code == 0, result.output
    env = profile.load_profile(str(env_out)).env
    assert env and conffile.read_like_nccl(conf_out.read_text()) == env
    assert "# source: modelled" in conf_out.read_text()
    refused = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--topology", "pcie-shm", "--export-conf", str(tmp_path / "no.conf")]
    )
    assert "not written" in refused.output and not (tmp_path / "no.conf").exists()


def test_conf_supply_of_a_process_the_environment_wins(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".nccl.conf").write_text("NCCL_PROTO=LL\nNCCL_ALGO=Tree\nNCCL_DEBUG=INFO\n")
    env = subprocess_env(HOME=str(home), NCCL_DEBUG="WARN")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        check = procenv.check_process(
            {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_DEBUG": "WARN", "NCCL_NTHREADS": "512"}, proc.pid
        )
    finally:
        proc.kill()
        proc.wait()
    status = {v.name: (v.status, v.actual) for v in check.variables}
    assert status == {
        "NCCL_PROTO": ("conf", "LL"),
        "NCCL_ALGO": ("conf-different", "Tree"),
        "NCCL_DEBUG": ("ok", "WARN"),
        "NCCL_NTHREADS": ("missing", None),
    }
    assert check.conf["NCCL_PROTO"]["path"] == str(home / ".nccl.conf")
    assert "NCCL_DEBUG" not in check.conf  # the environment wins over the conf file


@pytest.mark.slow
def test_check_cli_reports_conf_values(tmp_path, cli_runner):
    conf = tmp_path / "site.conf"
    conf.write_text("NCCL_PROTO=LL\nNCCL_IB_HCA=mlx5\n")
    prof = tmp_path / "p.env"
    prof.write_text("NCCL_PROTO=LL\n")
    env = subprocess_env(NCCL_CONF_FILE=str(conf), HOME=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        result = cli_runner.invoke(cli, ["check", "--profile", str(prof), "--pid", str(proc.pid)])
        as_json = cli_runner.invoke(cli, ["check", "--profile", str(prof), "--pid", str(proc.pid), "--json"])
    finally:
        proc.kill()
        proc.wait()
    assert result.exit_code == 0, result.output
    assert f"the conf file {conf} supplies LL (as the profile)" in result.output
    assert f"a conf file also supplies: NCCL_IB_HCA=mlx5 ({conf})" in result.output
    entry = json.loads(as_json.output)[0]
    assert entry["variables"][0]["status"] == "conf" and entry["ok"]
