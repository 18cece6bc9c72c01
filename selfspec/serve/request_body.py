"""OpenAI request bodies -> a checked `CompletionRequest`: every field's type and range, or a 400 naming the field.

Knows OpenAI's field names and defaults; never the tokenizer or the model (`prompts.py` encodes the prompt and checks
it against the context window). Fields the server does not implement are refused when they ask for something
(logprobs, tools, penalties, n > 1), not silently dropped; fields it has no use for (user, metadata) are ignored.
"""
from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass

from selfspec.serve.errors import bad_request

MAX_STOP_STRINGS = 4  # OpenAI's limit
SEED_RANGE = (-2**63, 2**64 - 1)  # torch's seeds, as `engine.SEED_RANGE` (not imported: that loads torch)
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat's default is the rest of the context
# Fields whose default is all this server does: a request that sets another value is refused.
UNSUPPORTED = {
    "logprobs": (None, False), "top_logprobs": (None, 0), "logit_bias": (None, {}), "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0), "tools": (None, []), "functions": (None, []), "tool_choice": (None, "none"),
    "echo": (None, False), "best_of": (None, 1), "suffix": (None, ""), "audio": (None,), "prediction": (None,),
}


@dataclass(frozen=True)
class CompletionRequest:
    chat: bool  # /v1/chat/completions (messages) or /v1/completions (prompt)
    prompt: object  # chat: [{"role", "content"}] with string contents; else a string or a list of token ids
    model: str | None = None  # None: whatever the server serves
    max_tokens: int | None = None  # None: the rest of the model's context window
    temperature: float = 1.0  # 0: greedy
    top_p: float | None = None
    top_k: int | None = None  # not OpenAI's: an extension as in vLLM
    stop: tuple[str, ...] = ()
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage

    def sampling(self) -> dict:
        """`SelfSpecModel.generate`'s sampling keywords: temperature 0 is greedy (and ignores top_p and top_k)."""
        if self.temperature == 0:
            return {"do_sample": False}
        return {"do_sample": True, "temperature": float(self.temperature), "top_p": self.top_p, "top_k": self.top_k}


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise bad_request(f"the request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def parse_chat(body: dict) -> CompletionRequest:
    return _parse(body, chat=True, prompt=_messages(body.get("messages")), default_max_tokens=None)


def parse_completion(body: dict) -> CompletionRequest:
    return _parse(body, chat=False, prompt=_prompt(body.get("prompt")), default_max_tokens=COMPLETIONS_MAX_TOKENS)


def _parse(body: dict, chat: bool, prompt, default_max_tokens: int | None) -> CompletionRequest:
    for name, defaults in UNSUPPORTED.items():
        if body.get(name) not in defaults:
            raise bad_request(f"{name} is not supported by this server", param=name, code="unsupported_parameter")
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise bad_request(f"n must be 1 (one completion per request), got {n!r}", param="n")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(f"model must be a string, got {model!r}", param="model")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise bad_request(f"stream must be true or false, got {stream!r}", param="stream")
    return CompletionRequest(
        chat=chat, prompt=prompt, model=model, max_tokens=_max_tokens(body, default_max_tokens),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0), top_p=_top_p(body), top_k=_top_k(body),
        stop=_stop(body.get("stop")), seed=_seed(body.get("seed")), stream=stream,
        include_usage=_include_usage(body.get("stream_options"), stream),
    )


def _messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list of {role, content} objects", param="messages")
    checked = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"{param} must be an object with role and content", param=param)
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise bad_request(f"{param}.role must be one of {sorted(CHAT_ROLES)}, got {role!r} (tools are not "
                              "supported)", param=f"{param}.role")
        if message.get("tool_calls"):
            raise bad_request(f"{param}.tool_calls: tools are not supported", param=f"{param}.tool_calls")
        checked.append({"role": CHAT_ROLES[role], "content": _content(message.get("content"), f"{param}.content")})
    return checked


def _content(content, param: str) -> str:
    """A string, or a list of text parts [{"type": "text", "text": ...}] (joined by newlines, as vLLM joins them)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") == "text"
                                         and isinstance(part.get("text"), str) for part in content):
        return "\n".join(part["text"] for part in content)
    raise bad_request(f"{param} must be a string or a list of text parts ({{\"type\": \"text\", \"text\": ...}}); "
                      "images, audio and files are not supported", param=param)


def _prompt(prompt):
    """A string or a list of token ids; a list of one of either is the same (a list of several would be a batch)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise bad_request(f"one prompt per request, got {len(prompt)}", param="prompt")
    raise bad_request("prompt must be a string or a non-empty list of token ids", param="prompt")


def _max_tokens(body: dict, default: int | None) -> int | None:
    given = {name: body[name] for name in ("max_completion_tokens", "max_tokens") if body.get(name) is not None}
    if len(set(map(repr, given.values()))) > 1:
        raise bad_request("max_tokens and max_completion_tokens disagree: give one", param="max_completion_tokens")
    for name, value in given.items():
        if not _is_int(value) or value < 1:
            raise bad_request(f"{name} must be an integer >= 1, got {value!r}", param=name)
        return int(value)
    return default


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not _is_number(value) or not low <= value <= high:
        raise bad_request(f"{name} must be a number in [{low:g}, {high:g}], got {value!r}", param=name)
    return float(value)


def _top_p(body: dict) -> float | None:
    value = body.get("top_p")
    if value is None:
        return None
    if not _is_number(value) or not 0 < value <= 1:
        raise bad_request(f"top_p must be a number in (0, 1], got {value!r}", param="top_p")
    return None if value == 1 else float(value)


def _top_k(body: dict) -> int | None:
    value = body.get("top_k")
    if value is None:
        return None
    if not _is_int(value) or value < -1:
        raise bad_request(f"top_k must be an integer >= 1, or 0 or -1 for no limit, got {value!r}", param="top_k")
    return int(value) if value > 0 else None


def _stop(stop) -> tuple[str, ...]:
    strings = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(strings, list) or not all(isinstance(s, str) and s for s in strings):
        raise bad_request(f"stop must be a non-empty string or a list of them, got {stop!r}", param="stop")
    if len(strings) > MAX_STOP_STRINGS:
        raise bad_request(f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(strings)}", param="stop")
    return tuple(dict.fromkeys(strings))


def _seed(seed) -> int | None:
    if seed is None:
        return None
    if not _is_int(seed) or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise bad_request(f"seed must be an integer in [-2**63, 2**64 - 1], got {seed!r}", param="seed")
    return int(seed)


def _include_usage(options, stream: bool) -> bool:
    if options is None:
        return False
    if not stream:
        raise bad_request("stream_options is only allowed when stream is true", param="stream_options")
    usage = options.get("include_usage", False) if isinstance(options, dict) else None
    if not isinstance(usage, bool):
        raise bad_request(f"stream_options must be an object with a boolean include_usage, got {options!r}",
                          param="stream_options")
    return usage


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
