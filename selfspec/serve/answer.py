"""One request's answer as the HTTP side reads it: the scheduler's events (from its thread, through an asyncio
queue) -> text pieces with OpenAI's stop strings applied, then one `Ending` (finish reason and usage), or the
request's `APIError` raised. Knows the scheduler's events and `StopText`; nothing about HTTP or JSON."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from selfspec.serve.response_body import usage
from selfspec.serve.scheduler import Failed, Finished, Piece, Ticket
from selfspec.serve.stop_text import StopText


@dataclass(frozen=True)
class Ending:
    finish_reason: str  # "stop" or "length"
    usage: dict


class EventInbox:
    """Carries a ticket's events from the decoding thread to the event loop that serves the request."""

    def __init__(self):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

    def __call__(self, event) -> None:  # the scheduler's on_event, called in its thread
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)

    async def get(self):
        return await self.queue.get()


async def read_answer(inbox: EventInbox, ticket: Ticket, stop_strings: tuple[str, ...]) -> AsyncIterator[str | Ending]:
    """Yield the answer's text pieces, then its Ending; raise the APIError of a request that failed.

    A stop string ends the answer at once (the scheduler is told to stop; its token counts so far are the usage)."""
    stop = StopText(stop_strings)
    completion_tokens = 0
    while True:
        event = await inbox.get()
        if isinstance(event, Failed):
            raise event.error
        if isinstance(event, Piece):
            completion_tokens += len(event.token_ids)
            text = stop.push(event.text)
            if text:
                yield text
            if stop.stopped:  # the engine stops at this token too; nothing it might still send is wanted
                ticket.cancel()
                yield Ending("stop", usage(len(ticket.job.prompt_ids), completion_tokens))
                return
        elif isinstance(event, Finished):
            text = stop.flush()
            if text:
                yield text
            yield Ending(event.finish_reason, usage(event.prompt_tokens, event.completion_tokens))
            return
