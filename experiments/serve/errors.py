"""The server's errors, as OpenAI's API writes them.

    raise APIError(400, "temperature must be >= 0, got -1", param="temperature")
    ->  HTTP 400  {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature",
                             "code": null}}

The `openai` package raises BadRequestError (400), AuthenticationError (401), NotFoundError (404: a model this
server does not serve, code model_not_found), RateLimitError (429) and
InternalServerError (5xx) from these and shows `message`.
"""
from __future__ import annotations

# 404: vLLM's type for an unknown model or route (OpenAI's body says invalid_request_error, code model_not_found)
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "NotFoundError",
          429: "rate_limit_error", 500: "internal_error", 503: "service_unavailable"}


class APIError(Exception):
    """An HTTP error with an OpenAI-style body; `headers` go on the response (Retry-After on a 429)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}
