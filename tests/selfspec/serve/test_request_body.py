"""OpenAI request bodies -> checked requests: defaults, and a 400 that names the field for each mistake."""
from __future__ import annotations

import pytest

from selfspec.serve.errors import APIError
from selfspec.serve.request_body import parse_chat, parse_completion, parse_json

MESSAGES = [{"role": "user", "content": "hi"}]


def test_chat_defaults_follow_openai():
    request = parse_chat({"model": "m", "messages": MESSAGES})
    assert request.chat and request.prompt == MESSAGES and request.model == "m"
    assert request.max_tokens is None and request.temperature == 1.0 and not request.stream
    assert request.sampling() == {"do_sample": True, "temperature": 1.0, "top_p": None, "top_k": None}


def test_completion_defaults_follow_openai():
    request = parse_completion({"prompt": "hi"})
    assert not request.chat and request.prompt == "hi" and request.max_tokens == 16 and request.model is None


def test_temperature_zero_is_greedy():
    assert parse_chat({"messages": MESSAGES, "temperature": 0, "top_p": 0.5}).sampling() == {"do_sample": False}


def test_fields_map_onto_generate_settings():
    request = parse_chat({"messages": MESSAGES, "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9,
                          "top_k": 4, "stop": "x", "seed": 3, "stream": True, "stream_options": {"include_usage": True},
                          "n": 1, "user": "someone", "metadata": {"a": 1}})
    assert (request.max_tokens, request.stop, request.seed, request.stream, request.include_usage) == (7, ("x",), 3,
                                                                                                       True, True)
    assert request.sampling() == {"do_sample": True, "temperature": 0.5, "top_p": 0.9, "top_k": 4}


def test_message_parts_and_developer_role():
    request = parse_chat({"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                          {"type": "text", "text": "b"}]}]})
    assert request.prompt == [{"role": "system", "content": "a\nb"}]


@pytest.mark.parametrize("prompt, expected", [("hi", "hi"), (["hi"], "hi"), ([5, 6], [5, 6]), ([[5, 6]], [5, 6])])
def test_completion_prompts(prompt, expected):
    assert parse_completion({"prompt": prompt}).prompt == expected


@pytest.mark.parametrize("chat, body, param", [
    (True, {}, "messages"),
    (True, {"messages": []}, "messages"),
    (True, {"messages": ["hi"]}, "messages[0]"),
    (True, {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    (True, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    (True, {"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
    (True, {"messages": MESSAGES, "max_tokens": -5}, "max_tokens"),
    (True, {"messages": MESSAGES, "max_tokens": 2.5}, "max_tokens"),
    (True, {"messages": MESSAGES, "max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens"),
    (True, {"messages": MESSAGES, "temperature": -1}, "temperature"),
    (True, {"messages": MESSAGES, "temperature": 1e9}, "temperature"),
    (True, {"messages": MESSAGES, "temperature": "hot"}, "temperature"),
    (True, {"messages": MESSAGES, "top_p": 0}, "top_p"),
    (True, {"messages": MESSAGES, "top_p": 1.5}, "top_p"),
    (True, {"messages": MESSAGES, "top_k": -2}, "top_k"),
    (True, {"messages": MESSAGES, "n": 2}, "n"),
    (True, {"messages": MESSAGES, "stop": ""}, "stop"),
    (True, {"messages": MESSAGES, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    (True, {"messages": MESSAGES, "stop": [1]}, "stop"),
    (True, {"messages": MESSAGES, "seed": 2**64}, "seed"),
    (True, {"messages": MESSAGES, "seed": True}, "seed"),
    (True, {"messages": MESSAGES, "stream": "yes"}, "stream"),
    (True, {"messages": MESSAGES, "stream_options": {"include_usage": True}}, "stream_options"),
    (True, {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": 1}}, "stream_options"),
    (True, {"messages": MESSAGES, "logprobs": True}, "logprobs"),
    (True, {"messages": MESSAGES, "tools": [{"type": "function"}]}, "tools"),
    (True, {"messages": MESSAGES, "presence_penalty": 0.5}, "presence_penalty"),
    (True, {"messages": MESSAGES, "model": 3}, "model"),
    (False, {"prompt": ["a", "b"]}, "prompt"),
    (False, {"prompt": []}, "prompt"),
    (False, {"prompt": None}, "prompt"),
    (False, {"prompt": [1.5]}, "prompt"),
    (False, {"prompt": "x", "echo": True}, "echo"),
    (False, {"prompt": "x", "best_of": 2}, "best_of"),
])
def test_each_mistake_is_a_400_naming_its_field(chat, body, param):
    with pytest.raises(APIError) as caught:
        (parse_chat if chat else parse_completion)(body)
    assert caught.value.status == 400 and caught.value.param == param
    assert set(caught.value.body()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b"\xff", b'"text"'])
def test_a_body_that_is_not_a_json_object_is_a_400(raw):
    with pytest.raises(APIError) as caught:
        parse_json(raw)
    assert caught.value.status == 400
