"""The one place where labd's errors become HTTP statuses: the domain errors know nothing of
HTTP, and a status is found by the error's type (the most specific class listed wins)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from instruments.errors import InstrumentError
from labd.errors import Conflict, NotFound, RequestError, Unavailable

STATUS: dict[type[Exception], int] = {
    NotFound: 404,
    Conflict: 409,
    Unavailable: 503,
    RequestError: 422,
    InstrumentError: 502,
}


def status_of(exc: Exception) -> int:
    """The HTTP status of an error, by the first of its classes that ``STATUS`` names."""
    return next(STATUS[cls] for cls in type(exc).__mro__ if cls in STATUS)


def install(app: FastAPI) -> None:
    """Answer every labd request error and instrument error as JSON with its status."""

    async def answer(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status_of(exc))

    app.add_exception_handler(RequestError, answer)
    app.add_exception_handler(InstrumentError, answer)
