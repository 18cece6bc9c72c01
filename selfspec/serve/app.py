"""The HTTP routes: OpenAI's /v1/chat/completions, /v1/completions (whole or streamed as server-sent events) and
/v1/models, with /health and /metrics. Every error is OpenAI's body (`errors.APIError`); /v1 needs the API key when
one is set; no CORS headers are sent, so browsers on other origins cannot call it.

Knows HTTP (FastAPI, Starlette); the decoding is the `Service`'s, the bodies' shapes are `request_body.py`'s and
`response_body.py`'s.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import time

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from selfspec.serve.answer import Ending, EventInbox, read_answer
from selfspec.serve.errors import APIError, internal
from selfspec.serve.metrics import CONTENT_TYPE, Metrics
from selfspec.serve.request_body import parse_chat, parse_completion, parse_json
from selfspec.serve.response_body import Answer, sse
from selfspec.serve.service import Service

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")


def create_app(service: Service, metrics: Metrics) -> FastAPI:
    config = service.config

    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.start()
        yield
        await run_in_threadpool(service.close)  # (already begun when the server's shutdown started: see server.py)

    app = FastAPI(title="selfspec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    async def require_key(request: Request) -> None:
        if config.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), config.api_key.encode()):
            raise APIError(401, "a valid API key is required: send the header 'Authorization: Bearer KEY'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_key)])

    @v1.get("/models")
    async def models():
        return {"object": "list", "data": [_model_card(config.model_name)]}

    @v1.get("/models/{name:path}")
    async def model(name: str):
        service.check_model(name)
        return _model_card(name)

    @v1.post("/chat/completions")
    async def chat(request: Request):
        return await _complete(request, parse_chat)

    @v1.post("/completions")
    async def completions(request: Request):
        return await _complete(request, parse_completion)

    async def _complete(request: Request, parse) -> Response:
        completion = parse(parse_json(await _read_body(request, config.max_body_bytes)))
        service.check_model(completion.model)
        job = await run_in_threadpool(service.job, completion)  # tokenizing a long prompt takes a while
        inbox = EventInbox()
        ticket = service.submit(job, inbox)
        answer = Answer(completion.chat, config.model_name)
        reading = read_answer(inbox, ticket, completion.stop)
        if completion.stream:
            return _TicketStream(ticket, _events(reading, answer, completion.include_usage))
        watcher = asyncio.create_task(_cancel_on_disconnect(request, ticket))
        try:
            parts = []
            async for item in reading:
                if isinstance(item, Ending):
                    return JSONResponse(answer.whole("".join(parts), item.finish_reason, item.usage))
                parts.append(item)
        finally:
            watcher.cancel()
            ticket.cancel()  # (nothing, once it has ended)
        raise internal("the answer ended without a finish")

    app.include_router(v1)

    @app.get("/health")
    async def health():
        if service.state == "ready":
            return {"status": "ok"}
        return JSONResponse({"status": service.state}, status_code=503, headers={"Retry-After": "5"})

    @app.get("/metrics")
    async def metrics_text():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError):
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException):  # no such route (404), wrong method (405)
        return await api_error(request, APIError(err.status_code, str(err.detail), headers=err.headers))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception):
        return JSONResponse(internal(f"{type(err).__name__}: {err}").body(), status_code=500)

    app.add_middleware(_CountRequests, metrics=metrics)
    return app


class _TicketStream(StreamingResponse):
    """A streamed answer whose ticket is cancelled however the response ends: a client that goes away (before the
    first event too) frees the decoding thread after its current step."""

    def __init__(self, ticket, events):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.ticket = ticket

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.ticket.cancel()  # (nothing, once it has ended)


async def _events(reading, answer: Answer, include_usage: bool):
    """The server-sent events of a streamed answer."""
    try:
        if answer.chat:
            yield sse(answer.chunk(first=True, include_usage=include_usage))
        async for item in reading:
            if isinstance(item, Ending):
                yield sse(answer.chunk(finish_reason=item.finish_reason, include_usage=include_usage))
                if include_usage:
                    yield sse(answer.usage_chunk(item.usage))
            else:
                yield sse(answer.chunk(item, include_usage=include_usage))
    except APIError as err:  # the status line (200) is sent: the error goes in the stream, as OpenAI's does
        yield sse(err.body())
    yield sse("[DONE]")


async def _read_body(request: Request, limit: int) -> bytes:
    too_large = APIError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


async def _cancel_on_disconnect(request: Request, ticket) -> None:
    """A whole (not streamed) answer's client went away: stop decoding it. Once the body is read, the next ASGI
    message is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    ticket.cancel()


def _model_card(name: str) -> dict:
    return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "selfspec"}


class _CountRequests:
    """ASGI middleware: counts every HTTP response by route and status (`selfspec_requests_total`); a pure ASGI
    wrapper, so streamed responses and client disconnects pass through untouched."""

    def __init__(self, app: FastAPI, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in ROUTES else "/v1/models" if path.startswith("/v1/models/") else "other"

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.metrics.request(endpoint, message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)
