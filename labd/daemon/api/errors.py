"""The one place where labd's errors become HTTP statuses: the domain errors know nothing of
HTTP, and a status is found by the error's type (the most specific class listed wins)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from instruments.errors import InstrumentError
from labd.errors import Conflict, NotFound, NotLeader, RequestError, Unavailable

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


#: The errors answered as ``{"detail": ...}`` with their status (the rest are 500s).
ANSWERED = (RequestError, InstrumentError)


def error_response(exc: Exception) -> JSONResponse:
    """A labd request error or an instrument error as the API answers it."""
    # A standby's refusal says where the leader answers (x-labd-leader), if known.
    headers = {"x-labd-leader": exc.leader_url} if isinstance(
        exc, NotLeader) and exc.leader_url else None
    return JSONResponse({"detail": str(exc)}, status_code=status_of(exc), headers=headers)


def install(app: FastAPI) -> None:
    """Answer every labd request error and instrument error as JSON with its status."""

    async def answer(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    for kind in ANSWERED:
        app.add_exception_handler(kind, answer)
    app.add_exception_handler(RequestValidationError, invalid)


async def invalid(request: Request, exc: Exception) -> Response:
    """422 with what was wrong where, as FastAPI says it, but always JSON: a body holding
    ``NaN`` or ``Infinity`` (Python's JSON reads them) would be echoed back in the errors'
    ``input`` and could not be written as JSON (a 500)."""
    assert isinstance(exc, RequestValidationError)
    errors: list[dict[str, Any]] = jsonable_encoder(exc.errors())
    try:
        content = json.dumps({"detail": errors}, allow_nan=False)
    except ValueError:
        kept = [{k: v for k, v in error.items() if k not in ("input", "ctx")}
                for error in errors]
        kept.append({"msg": "the body holds NaN or Infinity, which are not JSON numbers",
                     "type": "json_invalid"})
        content = json.dumps({"detail": kept}, allow_nan=False)
    return Response(content, status_code=422, media_type="application/json")
