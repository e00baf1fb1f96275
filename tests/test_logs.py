"""SGLang and vLLM log parsing: every format variant (own fixtures), random text, CLI."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from integration import logs
from nccl_tune.cli import cli
from tests.conftest import OWN_FIXTURES

LOGS = OWN_FIXTURES / "logs"


def _summary(name: str, **kw) -> dict:
    return logs.summarize_file(str(LOGS / name), **kw)


@pytest.mark.parametrize(
    "line, expected",
    [
        (
            "[04:40:55 TP0] Decode batch. #running-req: 2, #token: 4078, token usage: 0.00, "
            "gen throughput (token/s): 447.31, #queue-req: 0",
            {"running_req": 2, "tokens": 4078, "gen_throughput": 447.31, "queue_req": 0},
        ),
        (
            "[2026-04-05 20:02:51] Decode batch, #running-req: 32, #token: 11179, token usage: 0.08, "
            "cuda graph: True, gen throughput (token/s): 1635.11, #queue-req: 0",
            {"running_req": 32, "graph": True, "graph_kind": "cuda", "gen_throughput": 1635.11},
        ),
        (
            "[2026-01-10 08:05:01 DP0 TP0] Decode batch [1204], #running-req: 1, accept len: 2.50, "
            "accept rate: 0.75, npu graph: False, gen throughput (token/s): 30.00, #queue-req: 0,",
            {
                "iteration": 1204,
                "accept_len": 2.5,
                "accept_rate": 0.75,
                "graph": False,
                "graph_kind": "npu",
                "queue_req": 0,
            },
        ),
        (
            "2025-06-01 12:00:01,020 - sglang.srt.managers.scheduler - INFO - Decode batch. "
            "#running-req: 1, #token: 88, token usage: 0.00, largest-len: 0, gen throughput (token/s): 78.00, "
            "#queue-req: 0",
            {"largest_len": 0, "gen_throughput": 78.0},
        ),
        (
            "INFO:sglang.srt.managers.scheduler:Decode batch, #running-req: 1, cpu graph: True, "
            "gen throughput (token/s): 79.00, #queue-req: 0",
            {"graph_kind": "cpu", "gen_throughput": 79.0},
        ),
    ],
)
def test_decode_line_variants(line, expected):
    event = logs.parse_line(line)
    assert event is not None and event.kind == "decode"
    for key, value in expected.items():
        assert event.fields[key] == value


def test_prefixes_give_time_and_ranks():
    dated = logs.parse_line(
        "[2025-03-02 10:02:01 DP1 TP4] Decode batch. #running-req: 1, gen throughput (token/s): 1.0, #queue-req: 0"
    )
    assert dated.dated and dated.source == "DP1 TP4"
    timed = logs.parse_line("[23:59:59 TP0] Decode batch. #running-req: 1, gen throughput (token/s): 1.0")
    assert not timed.dated and timed.time_s == 23 * 3600 + 59 * 60 + 59 and timed.source == "TP0"
    ray = logs.parse_line(
        "(SGLangEngine pid=4242) [2026-03-01 09:00:00 TP0] Decode batch, "
        "#running-req: 4, gen throughput (token/s): 400.00, #queue-req: 0,"
    )
    assert ray.source == "TP0" and ray.fields["gen_throughput"] == 400.0
    pylog = logs.parse_line(
        "2025-06-01 12:00:00,512 - sglang - INFO - Decode batch. #running-req: 1, gen throughput (token/s): 5.00"
    )
    assert pylog.dated and pylog.time_s % 1 == pytest.approx(0.512)


def test_midnight_wrap_is_not_an_idle_gap():
    text = [
        "[23:59:59 TP0] Decode batch. #running-req: 1, gen throughput (token/s): 10.0",
        "[00:00:00 TP0] Decode batch. #running-req: 1, gen throughput (token/s): 50.0",
        "[00:00:01 TP0] Decode batch. #running-req: 1, gen throughput (token/s): 52.0",
    ]
    used, excluded = logs.throughput_lines(logs.parse_lines(text))
    assert [e.fields["gen_throughput"] for e in used] == [50.0, 52.0]
    assert len(excluded) == 1


def test_sglang_v02_time_only_first_line_after_idle_excluded():
    s = _summary("sglang_v02_time_tp.log")
    assert s["engine"] == "sglang" and s["decode_lines"] == 6 and s["prefill_lines"] == 2
    # 3.10 (first line) and 1.05 (after an idle prefill) are left out
    assert s["excluded_after_idle"] == 2
    assert s["gen_throughput_mean"] == pytest.approx((61.4 + 62.2 + 61.8 + 62.6) / 4)
    assert s["gen_throughput_median"] == pytest.approx((61.8 + 62.2) / 2)
    assert s["accept_len_mean"] is None and s["speculative"] is None


def test_sglang_v04_spec_server_args_and_ready():
    s = _summary("sglang_v04_date_spec.log")
    assert s["ready"] is True
    assert s["speculative"] == {
        "algorithm": "EAGLE3",
        "draft_model_path": "/models/EAGLE3-8B",
        "num_steps": 3,
        "eagle_topk": 1,
        "num_draft_tokens": 4,
    }
    assert s["server_args"]["tp_size"] == 8 and s["server_args"]["disable_custom_all_reduce"] is True
    assert s["accept_len_mean"] == pytest.approx(2.5)  # 2.4, 2.6, 2.8, 2.2
    assert s["gen_throughput_mean"] == pytest.approx(90.0)  # 20.00 is the first line, left out


def test_sglang_v05_comma_graph_trailing_comma():
    s = _summary("sglang_v05_comma_graph.log")
    assert s["decode_lines"] == 5 and s["speculative"] is None
    assert s["server_args"]["tp_size"] == 4
    assert s["graph_share"] == pytest.approx(4 / 5)
    assert s["gen_throughput_median"] == pytest.approx((149.75 + 150.25) / 2)
    assert s["gen_throughput_mean"] == pytest.approx((150.25 + 149.75 + 148.0 + 151.0) / 4)


def test_sglang_iteration_numbers_and_dp_ranks():
    s = _summary("sglang_iter_dp_spec.log")
    assert s["sources"] == ["DP0 TP0", "DP1 TP4"]
    assert s["excluded_after_idle"] == 2  # the first line of each rank
    assert s["gen_throughput_mean"] == pytest.approx(75.0)
    assert s["accept_len_mean"] == pytest.approx(2.4) and s["accept_rate_mean"] == pytest.approx(0.7)
    assert s["speculative"]["num_draft_tokens"] == 3


def test_python_logging_formats_and_idle_gap_option(tmp_path):
    s = _summary("sglang_python_logging.log")
    assert s["decode_lines"] == 5
    # 5.00 is out (after a prefill with nothing running); 2.00, 19 s after the line
    # before, counts: the same request's #token grew, so the server was slow, not idle.
    assert s["gen_throughput_mean"] == pytest.approx((78.0 + 2.0 + 80.0 + 79.0) / 4)
    assert s["excluded"] == {logs.AFTER_IDLE_PREFILL: 1}
    # Lines without #token fall back on the gap, which --idle-gap sets.
    bare = tmp_path / "bare.log"
    bare.write_text(
        "".join(
            f"[12:00:{sec:02d} TP0] Decode batch. #running-req: 1, gen throughput (token/s): {tps}, #queue-req: 0\n"
            for sec, tps in ((0, 9.0), (1, 80.0), (20, 2.0), (21, 78.0))
        )
    )
    strict = logs.summarize_file(str(bare))
    assert strict["gen_throughput_mean"] == pytest.approx(79.0)
    assert strict["excluded"] == {logs.AFTER_GAP: 1, logs.AT_LOG_START: 1}
    loose = logs.summarize_file(str(bare), idle_gap_s=30.0)
    assert loose["excluded"] == {logs.AT_LOG_START: 1}  # the 19 s gap no longer counts as idle


def test_slow_server_lines_seconds_apart_count():
    # Decode lines about 7 s apart, #token growing by 80 each (2 requests x 40 steps): a
    # slow server decoding all along. The idle-gap rule alone dropped every line.
    s = _summary("sglang_slow_server_7s_apart.log")
    assert s["decode_lines"] == 6 and s["gen_throughput_lines"] == 5
    assert s["excluded"] == {logs.AFTER_IDLE_PREFILL: 1}  # the first, after the start-up
    assert s["gen_throughput_median"] == pytest.approx(11.43)


def test_short_multi_rank_excerpt_keeps_each_ranks_first_line():
    # An excerpt (no start, no prefill): each rank's first line continues into its second.
    s = _summary("sglang_dp_excerpt_two_lines_per_rank.log")
    assert s["sources"] == ["DP0 TP0", "DP1 TP4", "DP2 TP8", "DP3 TP12"]
    assert s["gen_throughput_lines"] == 8 and s["excluded"] == {}
    assert s["gen_throughput_mean"] == pytest.approx(41.6375)
    one_each = logs.summarize_events(
        logs.parse_lines((LOGS / "sglang_dp_excerpt_two_lines_per_rank.log").read_text().splitlines()[:4])
    )
    assert one_each["gen_throughput_mean"] is None
    assert one_each["excluded"] == {logs.AT_LOG_START: 4}  # said, not silently empty


def test_vllm_old_form_accept_length_from_efficiency():
    s = _summary("vllm_v0_spec.log")
    assert s["engine"] == "vllm" and s["vllm"]["spec_lines"] == 2
    # emitted per step: 0.5 x (3 + 1) = 2.0 and 0.25 x (4 + 1) = 1.25
    assert s["accept_len_mean"] == pytest.approx((2.0 + 1.25) / 2)
    assert s["accept_rate_mean"] == pytest.approx(0.5)
    assert s["gen_throughput_mean"] == pytest.approx(42.5)
    event = logs.parse_line(
        "INFO 10-02 08:10:10 metrics.py:316] Speculative metrics: Draft acceptance "
        "rate: 0.400, System efficiency: 0.250, Number of speculative tokens: 4, "
        "Number of accepted tokens: 400, Number of draft tokens tokens: 1000, "
        "Number of emitted tokens tokens: 312."
    )
    assert event.fields["drafted"] == 1000 and event.fields["emitted"] == 312


def test_vllm_new_forms_percent_and_per_position():
    s = _summary("vllm_v1_spec.log")
    assert s["vllm"]["spec_lines"] == 3
    assert s["accept_len_mean"] == pytest.approx(3.0)  # the short form has no length
    assert s["accept_rate_mean"] == pytest.approx((0.75 + 0.5 + 0.833) / 3)
    event = logs.parse_line(
        "(APIServer pid=1) INFO 05-20 11:00:10 [metrics.py:96] SpecDecoding metrics: "
        "Mean acceptance length: 3.50, Accepted: 500 tokens, Drafted: 600 tokens, "
        "Per-position acceptance rate: 0.950, 0.850, 0.700, Avg Draft acceptance rate: 83.3%"
    )
    assert event.fields["per_position"] == [0.95, 0.85, 0.7]
    assert event.fields["accept_rate"] == pytest.approx(0.833)
    assert event.fields["accepted"] == 500 and event.fields["drafted"] == 600


def test_lines_that_only_look_similar_are_skipped():
    for text in [
        "Decode batch.",
        "Decode batch, nothing here",
        "server_args=ServerArgs(",
        "SpecDecoding metrics:",
        "Speculative metrics: none",
        "Prefill batch. #new-seq",
        "[99:99:99 TP0] Decode batch. #running-req: x, gen throughput (token/s): fast",
    ]:
        assert logs.parse_line(text) is None, text
    s = logs.summarize_events(
        logs.parse_lines(
            [
                "hello",
                "",
                "Decode batch, #running-req: x",
                "[10:00:00 TP0] Decode batch. #running-req: x, gen throughput (token/s): fast",
            ]
        )
    )
    assert s["decode_lines"] == 0 and s["gen_throughput_mean"] is None and s["engine"] is None


_PIECES = st.sampled_from(
    [
        "Decode batch",
        "Decode batch [",
        "Prefill batch",
        ". ",
        ", ",
        ": ",
        "#running-req",
        "accept len",
        "cuda graph",
        "gen throughput (token/s)",
        "True",
        "1e999",
        "nan",
        "-3",
        "%",
        "[",
        "]",
        "server_args=ServerArgs(",
        ")",
        "speculative_num_steps=",
        "'",
        "SpecDecoding metrics:",
        "Speculative metrics:",
        "Per-position acceptance rate:",
        "Avg generation throughput:",
        "2025-13-45 25:61:61",
        "12:34:56",
        " TP0",
        "\x00",
        "\ufffd",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=30), _PIECES), max_size=25).map("".join))
def test_random_text_never_raises(text):
    events = logs.parse_lines(text.splitlines() or [text])
    summary = logs.summarize_events(events)
    json.dumps(summary, allow_nan=False)  # always valid JSON: no NaN or Infinity


def test_cli_summarize_text_and_json(cli_runner):
    path = str(LOGS / "sglang_v04_date_spec.log")
    out = cli_runner.invoke(cli, ["logs", "summarize", path])
    assert out.exit_code == 0, out.output
    assert "accept len mean" in out.output and "2.50" in out.output and "num_steps=3" in out.output
    out = cli_runner.invoke(cli, ["logs", "summarize", path, "--json"])
    (data,) = json.loads(out.output)  # one shape: a list, one object per file
    for key in ("decode_lines", "gen_throughput_mean", "gen_throughput_median", "accept_len_mean", "accept_rate_mean"):
        assert key in data
    assert data["decode_lines"] == 4


def test_cli_missing_file_is_one_line_exit_2(cli_runner, tmp_path):
    out = cli_runner.invoke(cli, ["logs", "summarize", str(tmp_path / "none.log")])
    assert out.exit_code == 2
    assert out.output == f"Error: Invalid value for 'FILES...': {tmp_path / 'none.log'}: no such file.\n"
    out = cli_runner.invoke(cli, ["logs", "summarize", str(LOGS / "vllm_v0_spec.log"), "--idle-gap", "0"])
    assert out.exit_code == 2 and "--idle-gap" in out.output


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e999"])
def test_non_finite_numbers_are_not_figures(cli_runner, tmp_path, value):
    line = (
        f"[04:40:55 TP0] Decode batch. #running-req: 2, accept len: {value}, accept rate: {value}, "
        f"gen throughput (token/s): {value}, #queue-req: 0"
    )
    event = logs.parse_line(line)
    assert "accept_len" not in event.fields or not isinstance(event.fields["accept_len"], float)
    path = tmp_path / "nan.log"
    path.write_text(line + "\n" + line.replace("04:40:55", "04:40:56") + "\n")
    out = cli_runner.invoke(cli, ["logs", "summarize", str(path), "--json"])
    assert out.exit_code == 0
    (data,) = json.loads(out.output, parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c}"))
    assert data["decode_lines"] == 2 and data["accept_len_mean"] is None
    assert data["gen_throughput_mean"] is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello\nworld\n",
        "[2025-02-27 04:46:39] server_args=ServerArgs(model_path='m', "
        "speculative_algorithm='EAGLE3', speculative_num_steps=3)\n",
    ],
)
def test_a_log_without_decode_lines_says_so(cli_runner, tmp_path, text):
    path = tmp_path / "quiet.log"
    path.write_text(text)
    out = cli_runner.invoke(cli, ["logs", "summarize", str(path)])
    assert out.exit_code == 0 and "no decode lines found" in out.output
    assert "gen throughput" not in out.output
    if "server_args" in text:
        assert "algorithm=EAGLE3" in out.output
    (data,) = json.loads(cli_runner.invoke(cli, ["logs", "summarize", str(path), "--json"]).output)
    assert data["decode_lines"] == 0 and "no decode lines found" in data["note"]


def test_a_real_sglang_0523_cpu_log_dict_server_args_and_test_only_substitutes():
    # an excerpt of a real SGLang 0.5.23 server's log (tests/test_sglang_real.py's set-up)
    s = _summary("sglang_0523_cpu_real.log")
    assert s["engine"] == "sglang" and s["ready"] is True and s["decode_lines"] == 3
    # the first decode line follows a prefill that found nothing running: left out
    assert s["excluded"] == {logs.AFTER_IDLE_PREFILL: 1}
    assert s["gen_throughput_mean"] == pytest.approx((10.95 + 9.28) / 2)
    assert s["graph_share"] == 0.0 and s["sources"] == ["TP0"]  # "cpu graph: False"
    args = s["server_args"]  # 0.5.2x prints server_args={'model_path': ..., ...}
    assert (args["model_path"], args["device"], args["tp_size"], args["decode_log_interval"]) == (
        "/tmp/tiny-llama",
        "cpu",
        2,
        40,
    )
    assert args["speculative_algorithm"] is None and s["speculative"] is None
    assert s["substitutes"] == ["sgl_kernel", "torchvision"]


def test_substitute_marker_line_is_its_own_event():
    event = logs.parse_line("nccl-tune TEST-ONLY SUBSTITUTE: sgl_kernel (pure-torch helpers) from /x, pid 7")
    assert event.kind == "substitute" and event.fields == {"package": "sgl_kernel"}
    assert logs.parse_line("a line that mentions sgl_kernel") is None
