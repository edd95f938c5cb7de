"""The HTTP API under ``/v1`` and the WebSocket event stream."""
