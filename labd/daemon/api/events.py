"""``/v1/events``: the WebSocket event stream, a snapshot and then every event in order. A
client that falls behind is closed with 1013 (reconnect for a fresh snapshot); when the
daemon stops, with 1001."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from labd.daemon.api.deps import ServicesDep

router = APIRouter()


@router.websocket("/v1/events")
async def events(socket: WebSocket, services: ServicesDep) -> None:
    await socket.accept()
    snapshot, subscription = services.hub.subscribe(who="websocket")
    try:
        await socket.send_json({"kind": "snapshot", **snapshot})
        while True:
            event = await subscription.next()
            if event is None:  # fell behind, or the daemon is stopping
                if subscription.overflowed:
                    await socket.close(code=1013, reason="too slow; reconnect for a snapshot")
                else:
                    await socket.close(code=1001, reason="the daemon is stopping")
                return
            await socket.send_json(event.as_dict())
    except (WebSocketDisconnect, RuntimeError):
        pass  # the client went away (noticed at the next send)
    finally:
        subscription.close()
