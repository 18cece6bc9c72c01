"""A request's prompt -> token ids, and its token budget checked against the model's context window.

Encodes as `SelfSpecModel.generate` does (the chat template with its generation prompt; text through the tokenizer),
so a request's ids are those `generate` would decode from the same messages or text. Works on its own copy of the
tokenizer, behind a lock: request handlers encode in several threads while the decoding thread decodes text, and a
`tokenizers` object shared that way can fail with "Already borrowed". Knows nothing about the model but its context
window and vocabulary size.
"""
from __future__ import annotations

import copy
import threading
from dataclasses import dataclass

from jinja2 import TemplateError

from selfspec.inputs import apply_chat_template
from selfspec.serve.errors import bad_request
from selfspec.serve.request_body import CompletionRequest


@dataclass(frozen=True)
class EncodedPrompt:
    token_ids: list[int]
    max_tokens: int  # the request's budget, resolved: never past the context window


class PromptEncoder:
    def __init__(self, tokenizer, vocab_size: int, max_positions: int | None):
        if tokenizer is None:
            raise ValueError("serving needs the model's tokenizer: load the model with from_pretrained, or wrap it "
                             "with SelfSpecModel(model, tokenizer=...)")
        self._tokenizer = copy.deepcopy(tokenizer)
        self._lock = threading.Lock()
        self.vocab_size = vocab_size
        self.max_positions = max_positions  # None: the model's config does not say

    def encode(self, request: CompletionRequest) -> EncodedPrompt:
        ids = self._ids(request)
        if not ids:
            raise bad_request("the prompt is empty: it encodes to no tokens", param=self._param(request))
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise bad_request(f"prompt token ids must be in [0, {self.vocab_size})", param="prompt")
        room = None if self.max_positions is None else self.max_positions - len(ids)
        if room is not None and room < 1:
            raise bad_request(f"the prompt has {len(ids)} tokens, past the model's context window of "
                              f"{self.max_positions} (room for at least one new token is needed)",
                              param=self._param(request), code="context_length_exceeded")
        max_tokens = request.max_tokens
        if max_tokens is None:
            if room is None:
                raise bad_request("max_tokens is required: the model's context window is unknown", param="max_tokens")
            max_tokens = room
        elif room is not None and max_tokens > room:
            name = "max_completion_tokens" if request.chat else "max_tokens"
            raise bad_request(f"the prompt ({len(ids)} tokens) + {name} ({max_tokens}) exceeds the model's context "
                              f"window of {self.max_positions}; lower {name} to at most {room}",
                              param=name, code="context_length_exceeded")
        return EncodedPrompt(ids, max_tokens)

    def _ids(self, request: CompletionRequest) -> list[int]:
        if isinstance(request.prompt, list) and not request.chat:
            return [int(t) for t in request.prompt]
        with self._lock:
            if request.chat:
                try:
                    return [int(t) for t in apply_chat_template(self._tokenizer, request.prompt)]
                except ValueError as err:  # no chat template
                    raise bad_request(str(err), param="messages") from None
                except TemplateError as err:  # a template's own refusal (raise_exception("roles must alternate"))
                    raise bad_request(f"the model's chat template refused these messages: {err}",
                                      param="messages") from None
            return [int(t) for t in self._tokenizer(request.prompt).input_ids]

    @staticmethod
    def _param(request: CompletionRequest) -> str:
        return "messages" if request.chat else "prompt"
