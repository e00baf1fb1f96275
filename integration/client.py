"""A benchmark client for the OpenAI completions API (vLLM, SGLang) and SGLang's native
`/generate` endpoint.

It measures the way the public 8x PCIe report did (one request at a time, a fixed
token budget, greedy) and a little better: warm-up requests not counted, a fixed prompt
set, `ignore_eos` and `temperature: 0` sent explicitly (so every run generates exactly
`max_new_tokens`), per-run tokens, seconds and tok/s, the mean with a 95% Student-t
interval, time to first token when streaming, and the accept length per request from
`meta_info`, which SGLang fills for a finished request when speculative decoding is on:
1 + `spec_num_correct_drafts / spec_verify_ct` (accepted tokens per verify, the bonus token
counted: its log's `accept len`) where it gives the correct drafts (0.5.2x), else
`completion_tokens / spec_verify_ct` (its own `spec_accept_length`, which also counts the
first token, made by the prefill).

Request and response fields follow SGLang's http_server (`GenerateReqInput`: `text`,
`sampling_params`, `stream`; the answer's `text` and `meta_info` with `prompt_tokens`,
`completion_tokens`, `finish_reason`, `spec_verify_ct`, `spec_num_correct_drafts`). Streaming answers are
server-sent events: `data: {json}` lines, each carrying the text so far and its
`meta_info`, ending with `data: [DONE]`.

OpenAI completions (`--api openai`, what vLLM serves; SGLang serves it too): `POST
/v1/completions` with `model` (the first of `GET /v1/models` unless given), `prompt`,
`max_tokens`, `temperature: 0`, `ignore_eos: true` (an extension both engines accept) and,
streaming, `stream_options: {"include_usage": true}`, so the last event carries `usage`
with `completion_tokens`: the tokens are counted by the server, not by text chunks.

    python -m integration.client --url http://127.0.0.1:30000 --max-tokens 500 --num-runs 5
    python -m integration.client --api openai --url http://127.0.0.1:8000 --max-tokens 200
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

# A fixed prompt set (written for this project): run i uses PROMPTS[i % len(PROMPTS)].
PROMPTS = (
    "Write a detailed guide to maintaining a bicycle, covering the chain, brakes and tyres.",
    "Explain step by step how a compiler turns source code into machine code.",
    "Describe the water cycle and how it shapes the weather over a year.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List the main ideas of linear algebra and give an example of each.",
)


class ClientError(Exception):
    """A request failed; `completed` holds the runs that finished before it."""

    def __init__(self, message: str, completed: list[RunResult] | None = None):
        super().__init__(message)
        self.completed = list(completed or [])


@dataclass
class RunResult:
    """One request's figures."""

    index: int  # -1, -2 ... for warm-up requests
    prompt_index: int
    tokens: int
    seconds: float
    tok_s: float
    ttft_s: float | None = None  # streaming only
    decode_tok_s: float | None = None  # (tokens - 1) after the first token, streaming only
    accept_len: float | None = None
    spec_verify_ct: int | None = None
    finish_reason: str | None = None
    spec_correct_drafts: int | None = None  # SGLang's spec_num_correct_drafts


APIS = ("generate", "openai")


def request_body(prompt: str, max_tokens: int, stream: bool) -> dict:
    """The JSON of a /generate request: greedy, EOS ignored, exactly max_tokens new tokens."""
    return {
        "text": prompt,
        "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
        "stream": stream,
    }


def completion_body(model: str, prompt: str, max_tokens: int, stream: bool) -> dict:
    """The JSON of an OpenAI /v1/completions request: greedy, EOS ignored, usage streamed."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _connect(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ClientError(f"bad server URL {url!r}: expected http://HOST:PORT")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname, parts.port, timeout=timeout), parts.path.rstrip("/")


def _finish(meta: dict, started: float, ended: float, first: float | None, index: int, prompt_index: int) -> RunResult:
    tokens = int(meta.get("completion_tokens") or 0)
    seconds = ended - started
    verify = meta.get("spec_verify_ct")
    correct = meta.get("spec_num_correct_drafts")
    correct = int(correct) if isinstance(correct, (int, float)) and not isinstance(correct, bool) else None
    accept = accept_length(tokens, verify, correct)
    reason = meta.get("finish_reason")
    if isinstance(reason, dict):
        reason = reason.get("type")
    decode = None
    if first is not None and tokens > 1 and ended > first:
        decode = (tokens - 1) / (ended - first)
    return RunResult(
        index,
        prompt_index,
        tokens,
        seconds,
        tokens / seconds if seconds > 0 else 0.0,
        None if first is None else first - started,
        decode,
        accept,
        int(verify) if isinstance(verify, (int, float)) else None,
        None if reason is None else str(reason),
        correct,
    )


def accept_length(tokens: int, verify, correct: int | None) -> float | None:
    """Accepted tokens per verify (the bonus token counted) of `verify` verify forwards:
    1 + correct / verify with SGLang's correct-draft count, else tokens / verify (which
    also counts the prefill's token); None without verifies."""
    if not isinstance(verify, (int, float)) or isinstance(verify, bool) or verify <= 0:
        return None
    return 1.0 + correct / verify if correct is not None else tokens / verify


def _call(url: str, method: str, path: str, body: dict | None, timeout: float, read):
    """Send one request (`body` as JSON, if any), time it from the send, and hand the 200
    response and the start time to `read`; every failure (HTTP status, socket, bad JSON)
    is a ClientError naming the path."""
    conn, base = _connect(url, timeout)
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    started = time.perf_counter()
    try:
        conn.request(method, base + path, body=data, headers=headers)
        response = conn.getresponse()
        if response.status != 200:
            detail = response.read(500).decode("utf-8", "replace").strip()
            raise ClientError(f"{path} answered HTTP {response.status}: {detail}")
        return read(response, started)
    except ClientError:
        raise
    except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
        raise ClientError(f"{path} failed: {type(exc).__name__}: {exc}") from None
    finally:
        conn.close()


def generate_once(
    url: str,
    prompt: str,
    max_tokens: int,
    stream: bool = True,
    timeout: float = 600.0,
    index: int = 0,
    prompt_index: int = 0,
) -> RunResult:
    """Send one /generate request and time it; ClientError on any failure."""

    def read(response, started: float) -> RunResult:
        if stream:
            return _read_stream(response, started, index, prompt_index)
        payload = json.loads(response.read().decode("utf-8"))
        ended = time.perf_counter()
        if not isinstance(payload, dict) or "meta_info" not in payload:
            raise ClientError("/generate answer has no meta_info")
        return _finish(payload["meta_info"], started, ended, None, index, prompt_index)

    return _call(url, "POST", "/generate", request_body(prompt, max_tokens, stream), timeout, read)


def _read_stream(response, started: float, index: int, prompt_index: int) -> RunResult:
    first = None
    meta: dict = {}
    while True:
        raw = response.readline()
        if not raw:
            raise ClientError("the stream ended before 'data: [DONE]' (did the server die?)")
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue  # blank separators, comments, other SSE fields
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if isinstance(chunk, dict) and "error" in chunk:
            raise ClientError(f"the server reported an error: {chunk['error']}")
        meta = chunk.get("meta_info") or meta
        if first is None and (int(meta.get("completion_tokens") or 0) > 0 or chunk.get("text")):
            first = time.perf_counter()
    ended = time.perf_counter()
    if not meta:
        raise ClientError("the stream carried no meta_info")
    return _finish(meta, started, ended, first, index, prompt_index)


def served_model(url: str, timeout: float = 30.0) -> str:
    """The id of the first model `GET /v1/models` lists; ClientError when there is none."""

    def read(response, _started: float) -> str:
        data = json.loads(response.read().decode("utf-8", "replace")).get("data") or []
        if not data or not isinstance(data[0], dict) or not data[0].get("id"):
            raise ClientError("/v1/models lists no model")
        return str(data[0]["id"])

    return _call(url, "GET", "/v1/models", None, timeout, read)


def _usage_result(
    usage: dict | None,
    finish: str | None,
    started: float,
    ended: float,
    first: float | None,
    index: int,
    prompt_index: int,
) -> RunResult:
    if not isinstance(usage, dict) or "completion_tokens" not in usage:
        raise ClientError("the answer carried no usage.completion_tokens")
    meta = {"completion_tokens": usage["completion_tokens"], "finish_reason": finish}
    return _finish(meta, started, ended, first, index, prompt_index)


def complete_once(
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    stream: bool = True,
    timeout: float = 600.0,
    index: int = 0,
    prompt_index: int = 0,
) -> RunResult:
    """Send one OpenAI /v1/completions request and time it; ClientError on any failure."""

    def read(response, started: float) -> RunResult:
        if not stream:
            payload = json.loads(response.read().decode("utf-8"))
            ended = time.perf_counter()
            choices = payload.get("choices") or [{}]
            return _usage_result(
                payload.get("usage"), choices[0].get("finish_reason"), started, ended, None, index, prompt_index
            )
        first, usage, finish = None, None, None
        while True:
            raw = response.readline()
            if not raw:
                raise ClientError("the stream ended before 'data: [DONE]' (did the server die?)")
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if isinstance(chunk, dict) and "error" in chunk:
                raise ClientError(f"the server reported an error: {chunk['error']}")
            for choice in chunk.get("choices") or []:
                if first is None and choice.get("text"):
                    first = time.perf_counter()
                finish = choice.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
        return _usage_result(usage, finish, started, time.perf_counter(), first, index, prompt_index)

    return _call(url, "POST", "/v1/completions", completion_body(model, prompt, max_tokens, stream), timeout, read)


def summarize_runs(runs: list[RunResult], confidence: float = 0.95) -> dict:
    """Mean, stdev and interval (log scale) of per-run tok/s; overall tok/s; TTFT; accept length."""
    from nccl_tune import stats

    rates = [r.tok_s for r in runs]
    out: dict = {"runs": len(runs), "tokens": sum(r.tokens for r in runs), "seconds": sum(r.seconds for r in runs)}
    out["overall_tok_s"] = out["tokens"] / out["seconds"] if out["seconds"] > 0 else None
    if rates:
        mean, ci = stats.rate_ci(rates, confidence)  # log scale: never below zero
        out.update(tok_s_mean=mean, tok_s_stdev=statistics.stdev(rates) if len(rates) > 1 else None, tok_s_ci=ci)
    else:
        out.update(tok_s_mean=None, tok_s_stdev=None, tok_s_ci=None)
    ttft = [r.ttft_s for r in runs if r.ttft_s is not None]
    out["ttft_s_mean"] = statistics.fmean(ttft) if ttft else None
    decode = [r.decode_tok_s for r in runs if r.decode_tok_s is not None]
    out["decode_tok_s_mean"] = statistics.fmean(decode) if decode else None
    verified = [r for r in runs if r.spec_verify_ct]
    counted = all(r.spec_correct_drafts is not None for r in verified)
    out["accept_len"] = (
        accept_length(
            sum(r.tokens for r in verified),
            sum(r.spec_verify_ct for r in verified),
            sum(r.spec_correct_drafts for r in verified) if counted else None,
        )
        if verified
        else None
    )
    # what accept_len counts (see accept_length)
    out["accept_basis"] = None if not verified else "correct drafts" if counted else "completion tokens"
    return out


def benchmark(
    url: str,
    max_tokens: int,
    num_runs: int,
    warmup: int = 1,
    stream: bool = True,
    prompts: tuple[str, ...] = PROMPTS,
    timeout: float = 600.0,
    on_run: Callable[[RunResult], None] | None = None,
    api: str = "generate",
    model: str | None = None,
) -> list[RunResult]:
    """`warmup` uncounted requests, then `num_runs` timed ones, one at a time.

    `api` is "generate" (SGLang's /generate) or "openai" (/v1/completions of `model`, by
    default the first the server lists). `on_run` sees each timed run as it finishes. On
    a failure, ClientError carries the timed runs that finished.
    """
    if api not in APIS:
        raise ClientError(f"unknown api {api!r} (one of {', '.join(APIS)})")
    if api == "openai":
        name = model or served_model(url, timeout)

        def once(prompt, index, prompt_index):
            return complete_once(url, name, prompt, max_tokens, stream, timeout, index, prompt_index)
    else:

        def once(prompt, index, prompt_index):
            return generate_once(url, prompt, max_tokens, stream, timeout, index, prompt_index)

    for w in range(warmup):
        try:
            once(prompts[w % len(prompts)], -(w + 1), w % len(prompts))
        except ClientError as exc:
            raise ClientError(f"warm-up request {w + 1}: {exc}") from None
    done: list[RunResult] = []
    for i in range(num_runs):
        try:
            result = once(prompts[i % len(prompts)], i, i % len(prompts))
        except ClientError as exc:
            raise ClientError(f"run {i + 1} of {num_runs}: {exc}", done) from None
        done.append(result)
        if on_run:
            on_run(result)
    return done


def concurrent_round(
    url: str,
    model: str,
    max_tokens: int,
    concurrency: int,
    round_index: int = 0,
    prompts: tuple[str, ...] = PROMPTS,
    timeout: float = 600.0,
) -> tuple[list[RunResult], float]:
    """`concurrency` streaming /v1/completions requests sent together, one thread each (the
    server batches them): the runs in request order and the round's wall seconds, from
    before the first send to the last answer. ClientError naming the failed request(s),
    carrying the runs that finished."""
    import threading

    results: list[RunResult | None] = [None] * concurrency
    errors: list[str] = []
    start = threading.Event()

    def one(i: int) -> None:
        index = round_index * concurrency + i
        start.wait()
        try:
            results[i] = complete_once(
                url, model, prompts[index % len(prompts)], max_tokens, True, timeout, index, index % len(prompts)
            )
        except ClientError as exc:
            errors.append(f"request {i + 1} of {concurrency}: {exc}")

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    began = time.perf_counter()
    start.set()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    done = [r for r in results if r is not None]
    if errors:
        raise ClientError("; ".join(errors), done)
    return done, wall


def main(argv: list[str] | None = None) -> int:
    """Command line: benchmark a running server and print per-run and overall figures."""
    p = argparse.ArgumentParser(prog="python -m integration.client", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:30000")
    p.add_argument(
        "--api",
        choices=APIS,
        default="generate",
        help="generate: SGLang's /generate; openai: /v1/completions (vLLM, SGLang)",
    )
    p.add_argument("--model", default=None, help="model name for --api openai (default: the served one)")
    p.add_argument("--max-tokens", type=int, default=500)
    p.add_argument("--num-runs", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--no-stream", action="store_true", help="one JSON answer per request (no TTFT)")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.max_tokens < 1 or args.num_runs < 1 or args.warmup < 0:
        p.error("--max-tokens and --num-runs must be at least 1, --warmup at least 0")
    error = None
    try:
        runs = benchmark(
            args.url,
            args.max_tokens,
            args.num_runs,
            args.warmup,
            not args.no_stream,
            timeout=args.timeout,
            api=args.api,
            model=args.model,
        )
    except ClientError as exc:
        runs, error = exc.completed, str(exc)
    summary = summarize_runs(runs)
    if args.json:
        print(json.dumps({"runs": [asdict(r) for r in runs], "summary": summary, "error": error}))
    else:
        for r in runs:
            ttft = "" if r.ttft_s is None else f"  ttft {r.ttft_s * 1000:.0f} ms"
            acc = "" if r.accept_len is None else f"  accept len {r.accept_len:.2f}"
            print(f"run {r.index + 1}: {r.tokens} tokens in {r.seconds:.2f} s = {r.tok_s:.1f} tok/s{ttft}{acc}")
        if summary["tok_s_mean"] is not None:
            ci = summary["tok_s_ci"]
            print(
                f"mean {summary['tok_s_mean']:.1f} tok/s"
                + (f" (95% CI {ci[0]:.1f}-{ci[1]:.1f}, stdev {summary['tok_s_stdev']:.1f})" if ci else "")
            )
    if error:
        print(f"client: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
