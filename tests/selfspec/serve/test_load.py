"""The server under bounded load on the loopback interface, and its shutdown: every accepted request gets its whole
answer (the one `generate` gives alone for its seed) or an error; none is lost and none hangs."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from selfspec.serve.config import ServeConfig
from tests.selfspec.serve.live import CONFIG, MODEL, LiveServer, tiny_engine
from tests.selfspec.serve.paced import PacedEngine

NUM_REQUESTS, NUM_CLIENTS, MAX_TOKENS = 60, 8, 12
PROMPTS = ["Café au lait, crème brûlée", "def main():\n    return", "The quick brown fox", "Prices: 5€, 3£"]


def request_plan(i: int) -> dict:
    """Request i: chat or text, streamed or not, its own seed; every fifth client disconnects after one event."""
    return {"chat": i % 2 == 0, "stream": i % 3 != 0 or i % 5 == 4, "seed": 1000 + i, "prompt": PROMPTS[i % 4],
            "disconnect": i % 5 == 4}


def send(client: openai.OpenAI, plan: dict):
    options = dict(model=MODEL, max_tokens=MAX_TOKENS, temperature=0.8, seed=plan["seed"], stream=plan["stream"])
    if plan["chat"]:
        answer = client.chat.completions.create(messages=[{"role": "user", "content": plan["prompt"]}], **options)
    else:
        answer = client.completions.create(prompt=plan["prompt"], **options)
    if not plan["stream"]:
        choice = answer.choices[0]
        return choice.message.content if plan["chat"] else choice.text
    with answer:
        text = ""
        for chunk in answer:
            if plan["disconnect"]:
                return None  # leaving the block closes the connection mid-stream
            for choice in chunk.choices:
                text += (choice.delta.content or "") if plan["chat"] else choice.text
        return text


def test_sixty_requests_from_eight_clients_with_disconnects_lose_nothing():
    reference = tiny_engine()
    plans = [request_plan(i) for i in range(NUM_REQUESTS)]
    expected = {}
    for i, plan in enumerate(plans):
        if not plan["disconnect"]:
            prompt = [{"role": "user", "content": plan["prompt"]}] if plan["chat"] else plan["prompt"]
            expected[i] = reference.generate(prompt, max_new_tokens=MAX_TOKENS, do_sample=True, temperature=0.8,
                                             seed=plan["seed"], num_draft_tokens=CONFIG.num_draft_tokens).text
    with LiveServer(tiny_engine) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0, timeout=60)
        started = time.monotonic()
        with ThreadPoolExecutor(NUM_CLIENTS) as pool:
            results = list(pool.map(lambda plan: send(client, plan), plans, timeout=240))
        assert time.monotonic() - started < 240
        for i, text in enumerate(results):
            assert text == expected.get(i), f"request {i} ({plans[i]})"
        scheduler = live.server.service.scheduler
        deadline = time.monotonic() + 10
        while scheduler.active or scheduler.depth:  # the last disconnected one ends at its next step
            assert time.monotonic() < deadline
            time.sleep(0.01)
        answered = {s.labels["endpoint"]: s.value for s in live.metrics.requests.collect()[0].samples
                    if s.name.endswith("_total") and s.labels["status"] == "200"}
        assert answered.get("/v1/chat/completions", 0) + answered.get("/v1/completions", 0) == NUM_REQUESTS


def test_shutdown_finishes_what_it_can_and_fails_the_rest():
    config = ServeConfig(MODEL, num_draft_tokens=3, max_queue=4, shutdown_grace_s=0.5)
    reference = tiny_engine()
    quick_text = reference.generate("The quick", max_new_tokens=3, num_draft_tokens=3).text
    live = LiveServer(lambda: PacedEngine(tiny_engine(), delay=0.05), config).__enter__()
    try:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0, timeout=60)
        outcomes = {}

        def run(name, **options):
            try:
                response = client.completions.create(model=MODEL, temperature=0, **options)
                if options.get("stream"):
                    outcomes[name] = "".join(c.choices[0].text for c in response if c.choices)
                else:
                    outcomes[name] = response.choices[0].text
            except openai.APIError as err:
                outcomes[name] = err

        threads = [threading.Thread(target=run, args=("quick",), kwargs={"prompt": "The quick", "max_tokens": 3})]
        threads += [threading.Thread(target=run, args=(name,), kwargs={"prompt": "The quick", "max_tokens": 200,
                                                                        "stream": stream})
                    for name, stream in (("long streamed", True), ("long whole", False))]
        for thread in threads:
            thread.start()
            time.sleep(0.1)  # in this order
        scheduler = live.server.service.scheduler
        deadline = time.monotonic() + 30
        while scheduler.depth + scheduler.active < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        stop_started = time.monotonic()
        live.stop(timeout=60)
        assert time.monotonic() - stop_started < 30
        for thread in threads:
            thread.join(timeout=30)
            assert not thread.is_alive(), "a request hung through the shutdown"
    finally:
        live.__exit__(None, None, None)
    assert outcomes["quick"] == quick_text
    for name in ("long streamed", "long whole"):
        assert isinstance(outcomes[name], openai.APIError), (name, outcomes[name])
        assert "shut" in str(outcomes[name]).lower()


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_during_shutdown_is_503(stream):
    gate = threading.Event()
    config = ServeConfig(MODEL, num_draft_tokens=3, shutdown_grace_s=5)
    with LiveServer(lambda: PacedEngine(tiny_engine(), gate=gate), config) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0, timeout=60)
        holder = threading.Thread(target=client.completions.create,
                                  kwargs={"model": MODEL, "prompt": "The quick", "max_tokens": 2})
        holder.start()
        scheduler = live.server.service.scheduler
        while not scheduler.active:
            time.sleep(0.01)
        live.server.service.begin_close()  # as a shutdown does first; the held request keeps its connection
        time.sleep(0.1)
        with pytest.raises(openai.InternalServerError) as caught:
            client.completions.create(model=MODEL, prompt="The quick", max_tokens=2, stream=stream)
        assert caught.value.status_code == 503
        gate.set()
        holder.join(timeout=60)
        assert not holder.is_alive()
