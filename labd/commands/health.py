"""``labd health``: ask a daemon whether it is alive (``/healthz``) or ready (``/readyz``),
for a container's HEALTHCHECK and scripts: exit 0 if so, 1 if not, with one line on stderr.

It sends no key and reads nothing but the status (labd.daemon.api.probes). Over TLS the
daemon's certificate is not checked: the probe asks the daemon on this machine (or in this
container) and neither sends nor receives anything a third party could use, and a
certificate is rarely made out to 127.0.0.1.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from labd.commands.common import err_console

#: The port and the TLS setting the daemon itself reads (docs/service.md, "Settings").
PORT_ENV, TLS_ENV = "LABD_PORT", "LABD_TLS_CERT"
DEFAULT_PORT = 8470


def default_url() -> str:
    """The daemon on this machine, as its own ``LABD_*`` settings have it listen."""
    scheme = "https" if os.environ.get(TLS_ENV) else "http"
    port = os.environ.get(PORT_ENV, "").strip() or str(DEFAULT_PORT)
    return f"{scheme}://127.0.0.1:{port}"


def health(
    url: Annotated[str | None, typer.Option(
        "--url", help="The daemon's address [default: 127.0.0.1 on $LABD_PORT or 8470, "
                      "https where $LABD_TLS_CERT is set].")] = None,
    ready: Annotated[bool, typer.Option(
        "--ready", help="Ask whether it is ready (/readyz: store open, leading or standing "
                        "by) rather than alive (/healthz).")] = False,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=0.1, help="Seconds to wait for the answer.")] = 3.0,
) -> None:
    """Exit 0 if the daemon is alive (or, with --ready, ready), else 1.

    For a container's HEALTHCHECK, a load balancer's script or a monitoring check; no key
    is needed.
    """
    import httpx

    where = (url or default_url()).rstrip("/") + ("/readyz" if ready else "/healthz")
    try:
        answer = httpx.get(where, timeout=timeout, verify=False)
    except httpx.HTTPError as exc:
        err_console.print(f"{where}: no answer ({exc or type(exc).__name__})",
                          highlight=False, markup=False)
        raise typer.Exit(1) from None
    if answer.status_code != 200:
        err_console.print(f"{where}: {answer.status_code} {answer.text.strip()[:200]}",
                          highlight=False, markup=False)
        raise typer.Exit(1)
