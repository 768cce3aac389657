"""uvicorn's server with servelab's shutdown: in-flight requests get the grace to finish, then the engine aborts them,
and each ends as a request does (a last chunk with finish_reason "abort" and `[DONE]`, or a whole response).

uvicorn alone, given the grace as `timeout_graceful_shutdown`, cancels the request handlers when it ends: a streamed
response stops mid-body (the client reads an incomplete chunked body) and every handler logs a traceback. Here uvicorn
waits FLUSH_S longer than the grace, and when the grace is over the engine is stopped (the app's
`state.server.engine.stop()`: every request left is aborted, its KV blocks freed, its handler told), so the handlers
write their last chunk and return before uvicorn would cancel them.
"""
from __future__ import annotations

import asyncio
import logging

import uvicorn

log = logging.getLogger("servelab.serve")

FLUSH_S = 5.0       # after the grace: for the aborted requests' last chunks to reach their clients


class GracefulServer(uvicorn.Server):
    """config.timeout_graceful_shutdown is the grace in seconds (None: wait for the requests however long)."""

    def __init__(self, config: uvicorn.Config):
        self.grace_s = config.timeout_graceful_shutdown
        if self.grace_s is not None:
            config.timeout_graceful_shutdown = self.grace_s + FLUSH_S
        super().__init__(config)

    async def shutdown(self, sockets=None) -> None:
        timer = None
        if self.grace_s is not None:
            timer = asyncio.get_running_loop().call_later(self.grace_s, self._abort_in_flight)
        try:
            await super().shutdown(sockets=sockets)
        finally:
            if timer is not None:
                timer.cancel()

    def _abort_in_flight(self) -> None:
        server = getattr(getattr(self.config.app, "state", None), "server", None)
        if server is None:
            return
        log.info("shutdown grace of %g s over: aborting the requests left", self.grace_s)
        server.engine.stop()        # idempotent: the app's lifespan stops it again at its end
