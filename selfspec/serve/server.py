"""uvicorn serving the app, with a shutdown that leaves no request hanging: on SIGINT / SIGTERM (or `should_exit`)
the service stops accepting (503), lets accepted requests finish for `shutdown_grace_s`, then fails the rest (503),
while uvicorn waits for their responses to be sent. Knows uvicorn; the routes are `app.py`'s.

    server = build_server(load, ServeConfig("my-model"))
    server.run()                      # blocks; or server.run(sockets=[sock]) on a socket already bound
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable

import uvicorn

from selfspec.serve.app import create_app
from selfspec.serve.config import ServeConfig
from selfspec.serve.metrics import Metrics
from selfspec.serve.service import Service

log = logging.getLogger("selfspec.serve")
# uvicorn's own limit, past the grace period: the service has failed every request by then, so this only guards a
# response that a client stopped reading.
EXTRA_SHUTDOWN_S = 10


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, service: Service, metrics: Metrics):
        super().__init__(config)
        self.service = service
        self.metrics = metrics
        self.load_error: BaseException | None = None

    async def shutdown(self, sockets=None) -> None:
        self.service.begin_close()  # before uvicorn waits for the open requests: they finish or fail meanwhile
        await super().shutdown(sockets)

    def load_failed(self, err: BaseException) -> None:
        self.load_error = err
        self.should_exit = True

    @property
    def port(self) -> int | None:
        """The port it listens on, once started (useful with port 0)."""
        for server in self.servers:
            for sock in server.sockets:
                return sock.getsockname()[1]
        return None


def build_server(load: Callable[[], object], config: ServeConfig, log_level: str = "info") -> Server:
    """A server for the SelfSpecModel that `load()` returns, loaded in a thread once the server starts."""
    metrics = Metrics()
    server: Server | None = None
    service = Service(load, config, metrics, on_load_failure=lambda err: server.load_failed(err))
    app = create_app(service, metrics)
    uvicorn_config = uvicorn.Config(
        app, host=config.host, port=config.port, log_level=log_level, lifespan="on", server_header=False,
        timeout_graceful_shutdown=math.ceil(config.shutdown_grace_s) + EXTRA_SHUTDOWN_S,
    )
    server = Server(uvicorn_config, service, metrics)
    return server
