"""OpenAI's error shape: an `APIError` carries an HTTP status and the fields of `{"error": {"message", "type",
"param", "code"}}`. Knows no web framework: `app.py` turns it into a response."""
from __future__ import annotations


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def unavailable(message: str, code: str, retry_after_s: int = 1) -> APIError:
    """503: loading or shutting down; the client may try again later."""
    return APIError(503, message, type="server_error", code=code, headers={"Retry-After": str(retry_after_s)})


def queue_full(max_queue: int, retry_after_s: int = 1) -> APIError:
    return APIError(429, f"the server is busy: {max_queue} requests are already waiting; retry later",
                    type="rate_limit_error", code="queue_full", headers={"Retry-After": str(retry_after_s)})


def internal(message: str) -> APIError:
    return APIError(500, message, type="server_error", code="internal_error")
