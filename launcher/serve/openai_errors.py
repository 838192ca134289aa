"""Errors in OpenAI's shape, {"error": {"message", "type", "param", "code"}}, for every status the
server answers with (400, 404, 405, 408, 413, 422, 500, 503), so a client's own error handling
reads them. A 503 carries Retry-After; a 408 closes the connection (the rest of a slow body is
not waited for)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

RETRY_AFTER_S = 1
TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    500: "server_error",
    503: "server_busy",
}


class ApiError(Exception):
    """A request refused: its status, message and the parameter at fault."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code

    def response(self) -> JSONResponse:
        return error(self.status, self.message, self.param, self.code)


def error(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> JSONResponse:
    headers = {503: {"Retry-After": str(RETRY_AFTER_S)}, 408: {"Connection": "close"}}.get(status)
    body: dict[str, Any] = {
        "error": {
            "message": message,
            "type": TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }
    return JSONResponse(body, status_code=status, headers=headers)


def busy(message: str) -> JSONResponse:
    return error(503, message, code="server_busy")
