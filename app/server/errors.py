"""Errors a client sees, as OpenAI shapes them: {"error": {"message", "type", "param", "code"}}.

Every failure the server can foresee is an ApiError raised where it is found; the app turns it
into this JSON. Anything unforeseen is logged with its traceback and answered with a one-line 500.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
UNAVAILABLE = "unavailable_error"  # llama-server's type for 503
SERVER_ERROR = "server_error"


class ApiError(Exception):
    """A request that cannot be served, with the HTTP status and the JSON the client gets."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        *,
        error_type: str = INVALID_REQUEST,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.error_type = error_type
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, self.code, self.param)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, error_type: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def bad_field(param: str, message: str) -> ApiError:
    """400 for a request field of the wrong type or out of range."""
    return ApiError(400, message, "invalid_value", param=param)


def context_exceeded(message: str, param: str) -> ApiError:
    return ApiError(400, message, "context_length_exceeded", param=param)


def not_found(message: str, code: str = "not_found") -> ApiError:
    return ApiError(404, message, code)


def server_busy(retry_after_s: int) -> ApiError:
    return ApiError(
        503,
        "the server is busy: too many requests are waiting; retry later",
        "server_busy",
        error_type=UNAVAILABLE,
        headers={"Retry-After": str(retry_after_s)},
    )


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", "shutting_down", error_type=UNAVAILABLE)


def internal_error() -> ApiError:
    return ApiError(500, "internal server error (details are in the server's log)", "internal_error",
                    error_type=SERVER_ERROR)
