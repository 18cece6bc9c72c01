"""The server through the real `openai` client (and raw HTTP for what the client will not send), against a tiny model
served on a loopback port: answers equal `SelfSpecModel.generate`'s, streamed or not; OpenAI's stop strings, seeds,
usage and finish reasons; every error path with OpenAI's error body."""
from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from selfspec.serve.config import ServeConfig
from tests.selfspec.serve.live import CONFIG, MODEL, LiveServer, tiny_engine
from tests.selfspec.serve.paced import PacedEngine

MESSAGES = [{"role": "system", "content": "You answer in French."}, {"role": "user", "content": "Café au lait?"}]
PROMPT = "The quick brown fox jumps over the lazy dog. The quick"


@pytest.fixture(scope="module")
def server():
    with LiveServer(tiny_engine) as live:
        yield live


@pytest.fixture(scope="module")
def reference():
    """A second wrapper of the same weights, for the answers `generate` gives alone."""
    return tiny_engine()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def expected(reference, prompt, max_new_tokens, **options):
    return reference.generate(prompt, max_new_tokens=max_new_tokens, num_draft_tokens=CONFIG.num_draft_tokens,
                              **options)


def streamed(chunks, chat=True):
    """A stream's chunks -> (text, finish_reason, usage) from the client's own objects."""
    text, finish, usage = "", None, None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += (choice.delta.content or "") if chat else choice.text
            finish = choice.finish_reason or finish
    return text, finish, usage


# -- answers ---------------------------------------------------------------------------------------------

def test_chat_answers_equal_generate_whole_and_streamed(client, reference):
    out = expected(reference, MESSAGES, 24)
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0)
    assert whole.choices[0].message.content == out.text and whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason == "length"
    prompt_tokens = out.sequences.shape[1] - 24
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens) == (
        prompt_tokens, 24, prompt_tokens + 24)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=24,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert len(chunks) > 4  # streamed as the verifier accepts, not in one piece
    assert streamed(chunks)[:2] == (out.text, "length")


def test_completions_equal_generate_for_text_and_token_ids(client, reference):
    out = expected(reference, PROMPT, 20)
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0)
    assert whole.choices[0].text == out.text and whole.object == "text_completion"
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stream=True))
    assert streamed(chunks, chat=False)[:2] == (out.text, "length")
    ids = reference.tokenizer(PROMPT).input_ids
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=20, temperature=0)
    assert by_ids.choices[0].text == out.text and by_ids.usage.prompt_tokens == len(ids)


def test_the_default_budget_of_completions_is_16_tokens(client):
    assert client.completions.create(model=MODEL, prompt=PROMPT, temperature=0).usage.completion_tokens == 16


def test_a_seed_gives_generates_sample_every_time(client, reference):
    for seed in (0, 7):
        out = expected(reference, MESSAGES, 16, do_sample=True, temperature=0.9, top_p=0.95, seed=seed)
        texts = {client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0.9,
                                                top_p=0.95, seed=seed).choices[0].message.content for _ in range(2)}
        texts.add(streamed(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16,
                                                          temperature=0.9, top_p=0.95, seed=seed, stream=True))[0])
        assert texts == {out.text}


def test_a_stop_string_ends_the_answer_before_it(client, reference):
    full = expected(reference, PROMPT, 40).text
    start = next(i for i in range(len(full) // 3, len(full) - 2) if "\ufffd" not in full[i : i + 2]
                 and full[i : i + 2] not in full[:i])
    stop = full[start : start + 2]
    out = expected(reference, PROMPT, 40, stop_strings=[stop])  # the engine stops at the token completing it
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop=[stop, "\x00"])
    assert whole.choices[0].text == full[:start] and whole.choices[0].finish_reason == "stop"
    assert out.text.startswith(full[:start] + stop)
    assert whole.usage.completion_tokens == out.sequences.shape[1] - len(reference.tokenizer(PROMPT).input_ids)
    chunks = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop=stop,
                                       stream=True)
    assert streamed(chunks, chat=False)[:2] == (full[:start], "stop")


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("selfspec_requests_total{endpoint=\"/v1/completions\",status=\"200\"}", "selfspec_queue_depth 0.0",
                 "selfspec_active_rows 0.0", "selfspec_generated_tokens_total", "selfspec_tokens_per_forward_bucket",
                 "selfspec_accepted_draft_length_bucket", "selfspec_target_forwards_total"):
        assert name in text, name
    drafts = server.metrics.accepted_draft_length.collect()[0].samples
    assert next(s.value for s in drafts if s.name.endswith("_count")) > 0  # decode steps were verified drafts


def test_no_cors_headers(server):
    response = httpx.options(f"{server.url}/v1/chat/completions",
                             headers={"Origin": "http://elsewhere.example", "Access-Control-Request-Method": "POST"})
    assert not any(h.lower().startswith("access-control-") for h in response.headers)


# -- errors ------------------------------------------------------------------------------------------------

def assert_openai_error(response: httpx.Response, status: int, param=None, code=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param and (code is None or error["code"] == code)
    return error


def post(server, path: str, **kwargs) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/{path}", timeout=60, **kwargs)


def test_malformed_bodies_are_400(server):
    assert_openai_error(post(server, "chat/completions", content=b"{not json"), 400)
    assert_openai_error(post(server, "chat/completions", json=[1]), 400)
    assert_openai_error(post(server, "completions", json={"prompt": "x", "n": 3}), 400, "n")


def test_errors_through_the_client(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2)
    assert caught.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=-1)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=-3)
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert caught.value.body["code"] == "model_not_found"


def test_past_the_context_window_is_400(server, reference):
    window = reference.target.max_positions
    long_prompt = [5] * (window + 1)
    assert_openai_error(post(server, "completions", json={"prompt": long_prompt}), 400, "prompt",
                        "context_length_exceeded")
    error = assert_openai_error(post(server, "completions", json={"prompt": PROMPT, "max_tokens": window}), 400,
                                "max_tokens", "context_length_exceeded")
    assert "lower max_tokens" in error["message"]
    assert_openai_error(post(server, "completions", json={"prompt": [reference.target.vocab_size]}), 400, "prompt")
    assert_openai_error(post(server, "completions", json={"prompt": ""}), 400, "prompt")


def test_a_body_over_the_limit_is_413(server):
    big = b'{"prompt": "' + b"x" * CONFIG.max_body_bytes + b'"}'
    assert_openai_error(post(server, "completions", content=big, headers={"Content-Type": "application/json"}), 413)


def test_unknown_routes_and_methods_have_openai_bodies(server):
    assert_openai_error(httpx.get(f"{server.url}/v1/nothing"), 404)
    assert_openai_error(httpx.get(f"{server.url}/v1/chat/completions"), 405)


def test_a_disconnect_mid_stream_frees_the_worker_at_the_next_step(reference):
    with LiveServer(lambda: PacedEngine(tiny_engine(), delay=0.02)) as live:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 400, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{live.url}/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
        disconnected = time.monotonic()
        scheduler = live.server.service.scheduler
        while scheduler.active:
            assert time.monotonic() - disconnected < 10, "the worker kept decoding for a client that left"
            time.sleep(0.01)
        generated = live.metrics.generated_tokens._value.get()
        assert generated < 100  # 400 would take >= 4 s at 20 ms a step
        quick = post(live, "completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0})
        assert quick.status_code == 200


def test_a_full_queue_is_429_with_retry_after():
    gate = threading.Event()
    config = ServeConfig(MODEL, max_queue=0, max_batch=1, num_draft_tokens=3, shutdown_grace_s=5)  # (one at a time)
    with LiveServer(lambda: PacedEngine(tiny_engine(), gate=gate), config) as live:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
        first = threading.Thread(target=post, args=(live, "completions"), kwargs={"json": body})
        first.start()
        scheduler = live.server.service.scheduler
        while not scheduler.active:
            time.sleep(0.01)
        refused = post(live, "completions", json=body)
        assert_openai_error(refused, 429, code="queue_full")
        assert int(refused.headers["Retry-After"]) >= 1
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0, timeout=30)
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
        gate.set()
        first.join(timeout=60)
        assert not first.is_alive()


def test_503_while_loading_then_ready():
    loaded = threading.Event()

    def slow_load():
        assert loaded.wait(timeout=60)
        return tiny_engine()

    with LiveServer(slow_load, wait_ready=False) as live:
        health = httpx.get(f"{live.url}/health")
        assert health.status_code == 503 and health.json() == {"status": "loading"}
        refused = post(live, "completions", json={"prompt": PROMPT})
        assert_openai_error(refused, 503, code="loading")
        assert refused.headers["Retry-After"]
        loaded.set()
        live.wait_for("ok")
        assert post(live, "completions", json={"prompt": PROMPT, "max_tokens": 2}).status_code == 200


def test_the_api_key_is_required_on_v1_when_set():
    config = ServeConfig(MODEL, api_key="sekret", num_draft_tokens=3, shutdown_grace_s=5)
    with LiveServer(tiny_engine, config) as live:
        body = {"prompt": PROMPT, "max_tokens": 2}
        assert_openai_error(post(live, "completions", json=body), 401, code="invalid_api_key")
        wrong = post(live, "completions", json=body, headers={"Authorization": "Bearer sekreT"})
        assert_openai_error(wrong, 401, code="invalid_api_key")
        assert_openai_error(httpx.get(f"{live.url}/v1/models", headers={"Authorization": "Basic sekret"}), 401)
        assert post(live, "completions", json=body, headers={"Authorization": "Bearer sekret"}).status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{live.url}/v1", api_key="nope", max_retries=0).models.list()
        assert openai.OpenAI(base_url=f"{live.url}/v1", api_key="sekret", max_retries=0).models.list().data
        assert httpx.get(f"{live.url}/health").status_code == 200  # probes need no key
