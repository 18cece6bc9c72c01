"""OpenAI response bodies: a whole chat completion or text completion, the chunks of a streamed one, and the
server-sent events that carry them. Knows OpenAI's shapes only; the text and counts come from the caller."""
from __future__ import annotations

import json
import time
import uuid


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def sse(data) -> bytes:
    """One server-sent event: a JSON object, or the closing "[DONE]"."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n".encode()


class Answer:
    """The bodies of one answer, chat ("chat.completion") or text ("text_completion"), all with one id and time."""

    def __init__(self, chat: bool, model: str):
        self.chat = chat
        self.model = model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def whole(self, text: str, finish_reason: str, counts: dict) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self._envelope(self._object(), [choice], usage=counts)

    def chunk(self, text: str | None = None, finish_reason: str | None = None, first: bool = False,
              include_usage: bool = False) -> dict:
        """A streamed piece: text, or (finish_reason given) the closing chunk; `first` opens a chat's assistant
        message. With include_usage every chunk carries "usage": null, as OpenAI's do, but the last."""
        if self.chat:
            delta = {"role": "assistant", "content": text or ""} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self._envelope(self._object(chunk=True), [choice], **({"usage": None} if include_usage else {}))

    def usage_chunk(self, counts: dict) -> dict:
        """stream_options.include_usage: the last chunk, with no choices."""
        return self._envelope(self._object(chunk=True), [], usage=counts)

    def _object(self, chunk: bool = False) -> str:
        if self.chat:
            return "chat.completion.chunk" if chunk else "chat.completion"
        return "text_completion"

    def _envelope(self, kind: str, choices: list, **extra) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, **extra}
