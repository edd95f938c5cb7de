"""``labd run`` as a process whose JSON log lines a test reads as they come: started with
its token in the environment (never argv), every line of stdout and stderr kept, and
waits on a line that matches, each with a deadline."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from labd import deadlines

LABD = [sys.executable, "-m", "labd"]
Line = dict[str, Any]


@dataclass
class Running:
    process: asyncio.subprocess.Process
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    logs: list[Line] = field(default_factory=list)
    """stderr's lines read as JSON."""
    not_json: list[str] = field(default_factory=list)
    """stderr's lines that are not (none, where logs are JSON)."""
    _new: asyncio.Event = field(default_factory=asyncio.Event)
    _readers: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    async def start(cls, *args: str, env: dict[str, str] | None = None,
                    cwd: str | None = None) -> Running:
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("LABD_", "NOTIFY_", "WATCHDOG_"))
                or k == deadlines.SCALE_ENV}
        process = await asyncio.create_subprocess_exec(
            *LABD, "run", *args, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**base, **(env or {})}, cwd=cwd)
        running = cls(process)
        assert process.stdout is not None and process.stderr is not None
        running._readers = [asyncio.create_task(running._read(process.stdout, running.stdout)),
                            asyncio.create_task(running._read(process.stderr, running.stderr))]
        return running

    async def _read(self, stream: asyncio.StreamReader, into: list[str]) -> None:
        while line := await stream.readline():
            text = line.decode()
            into.append(text)
            if into is self.stderr:
                try:
                    self.logs.append(json.loads(text))
                except ValueError:
                    self.not_json.append(text)
            self._new.set()
        self._new.set()

    @property
    def output(self) -> str:
        return "".join(self.stdout) + "".join(self.stderr)

    async def wait_for(self, what: str, found: Callable[[], Any],
                       timeout: float | None = None) -> Any:
        """Until ``found()`` gives something; fails if the process ends or ``timeout``
        (default: a process's ready deadline) passes first."""
        limit = deadlines.current().of("process_ready") if timeout is None else timeout
        async with asyncio.timeout(limit):
            while not (result := found()):
                if self.process.returncode is not None or all(r.done() for r in self._readers):
                    raise AssertionError(f"labd run ended waiting for {what}:\n{self.output}")
                self._new.clear()
                await self._new.wait()
            return result

    async def log(self, what: str, match: Callable[[Line], bool], *, after: int = 0,
                  timeout: float | None = None) -> Line:
        """The first log line from index ``after`` on that ``match`` accepts."""
        return await self.wait_for(
            what, lambda: next((line for line in self.logs[after:] if match(line)), None),
            timeout)

    def said(self) -> list[str]:
        """stdout's lines as text: each JSON line's message (``--log-format json``)."""
        out = []
        for line in self.stdout:
            try:
                out.append(str(json.loads(line)["message"]))
            except (ValueError, KeyError, TypeError):
                out.append(line)
        return out

    async def url(self) -> str:
        """The API's URL, from the start-up report."""
        found = await self.wait_for("the start-up report", lambda: next(
            (m for line in self.said() if (m := re.search(r"API (http\S+)/v1", line))), None))
        return str(found.group(1))

    async def control(self) -> str:
        found = await self.wait_for("the control endpoint", lambda: next(
            (m for line in self.said()
             if (m := re.search(r"control endpoint: (http\S+)", line))), None))
        return str(found.group(1))

    async def stop(self, timeout: float) -> int:
        """SIGTERM, then its exit within ``timeout`` seconds (killed if not, and failed)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(timeout):
                code = await self.process.wait()
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
            raise AssertionError(
                f"labd run did not end within {timeout:g} s of SIGTERM") from None
        await asyncio.gather(*self._readers)
        return code

    async def close(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
