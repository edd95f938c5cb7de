"""labd's logs: one configuration for every command (the daemon, the agent, the tools).

- **Formats.** ``human``: rich's handler on a terminal, plain ``time level logger: message``
  lines elsewhere (the journal stamps its own time, but a file needs one); ``json``: one
  JSON object per line for collectors (Loki, Vector, journald's JSON export), with the
  fields ``ts``, ``level``, ``logger``, ``message`` and, where a line is about one,
  ``instrument``, ``host``, ``job``, ``topic``.
- **Levels per module.** ``info,labd.fabric=debug,instruments.wire=warning``: the first
  bare level is the root's, ``NAME=LEVEL`` sets one logger and those below it.
- **A file with rotation** (``RotatingFileHandler``): ``max_bytes`` per file, ``backups``
  files kept beside it.
- **Libraries quiet unless asked.** Alembic, SQLAlchemy, aiomqtt, uvicorn and httpx log at
  WARNING whatever the root's level, unless the level names them (``info,alembic=info``):
  at ``info`` Alembic alone made 16 of a start-up's 27 lines.
- **JSON everywhere.** With ``json`` the consoles a command prints on (its start-up report,
  its errors) are made to write JSON lines too (:func:`json_consoles`), and Python's
  warnings go through the log: every line on stdout and stderr parses.
- **Names as fields.** A line about an instrument or a host carries its name in
  ``extra`` (``log.info("...", extra={"instrument": name})``) or through :func:`about`.
- **Secrets never appear.** Nothing logs a token or a password in the first place; as a
  last line of defence every handler replaces each registered secret (:func:`add_secrets`)
  with ``***`` in the message, its arguments, its traceback and its fields.

Only the standard library here, and rich where a terminal asks for it: the GPU-host agent
loads this module."""

from __future__ import annotations

import datetime
import io
import json
import logging
import logging.handlers
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any, Literal

__all__ = ["FIELDS", "FORMATS", "LEVELS", "QUIET", "JsonLines", "LogFormat",
           "LogSettingsError", "about", "add_secrets", "configure", "json_consoles",
           "level_for", "parse_levels", "redact"]

#: The structured fields a line may carry (``extra=``), in the order JSON lines give them.
FIELDS = ("instrument", "host", "job", "switch", "topic")
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR, "critical": logging.CRITICAL}
FORMATS = ("human", "json")
LogFormat = Literal["human", "json"]
#: Shorter secrets are not searched for: replacing every "ab" would garble the logs, and
#: a secret that short protects nothing anyway.
MIN_SECRET = 4
MASK = "***"
#: The name of the handler :func:`configure` installs (and replaces when called again).
_HANDLER = "labd"
#: Libraries whose INFO lines say nothing an operator acts on (Alembic's plugin set-up and
#: migration context, SQLAlchemy's engine, aiomqtt's client, uvicorn's access lines, httpx's
#: requests): WARNING and above unless the level names them or a logger above or below.
QUIET = ("alembic", "sqlalchemy", "aiomqtt", "uvicorn", "httpx", "httpcore")

_secrets: set[str] = set()
_secrets_lock = threading.Lock()


class LogSettingsError(ValueError):
    """A log option that cannot be used; the message says which and why."""


def add_secrets(*values: str | None) -> None:
    """Register values no log line may show (tokens, passwords, keys)."""
    with _secrets_lock:
        _secrets.update(v for v in values if v and len(v) >= MIN_SECRET)


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by ``***`` (longest first, so a
    secret that contains another is masked whole)."""
    with _secrets_lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def about(logger: logging.Logger, **fields: str) -> logging.LoggerAdapter[logging.Logger]:
    """``logger`` whose every line carries ``fields`` (``instrument=``, ``host=``...)."""
    return _Fields(logger, fields)


class _Fields(logging.LoggerAdapter[logging.Logger]):
    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        # The line's own extra wins over the adapter's: a bus adapter may name the host
        # a message came from.
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def parse_levels(spec: str) -> tuple[int, dict[str, int]]:
    """``"info,labd.fabric=debug"`` → (root level, {logger: level}); LogSettingsError
    naming the part that is wrong."""
    root: int | None = None
    loggers: dict[str, int] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, sep, level = part.rpartition("=")
        name, level = name.strip(), level.strip().lower()
        if level not in LEVELS:
            raise LogSettingsError(f"{level!r} is no level: expected one of "
                                   f"{', '.join(LEVELS)} (e.g. info,labd.fabric=debug)")
        if not sep:
            if root is not None:
                raise LogSettingsError(f"two levels for every logger ({part!r}); name the "
                                       "logger for the second: NAME=LEVEL")
            root = LEVELS[level]
        elif not name or not all(piece.isidentifier() for piece in name.split(".")):
            raise LogSettingsError(f"{name!r} is no logger name (e.g. labd.fabric=debug)")
        elif name in loggers:
            raise LogSettingsError(f"logger {name!r} is given twice")
        else:
            loggers[name] = LEVELS[level]
    return (logging.WARNING if root is None else root), loggers


class _Redacting(logging.Filter):
    """The last line of defence: the record's text, traceback and fields without any
    registered secret, before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _secrets:
            return True
        record.msg, record.args = redact(record.getMessage()), None
        if record.exc_info:
            # Formatted here and the exception dropped, so that no handler formats it
            # again from the original (rich's tracebacks would show its locals).
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        for name in FIELDS:
            value = record.__dict__.get(name)
            if isinstance(value, str):
                record.__dict__[name] = redact(value)
        return True


def _fields(record: logging.LogRecord) -> dict[str, str]:
    return {name: str(record.__dict__[name]) for name in FIELDS
            if record.__dict__.get(name) is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per line; never raises on what a line carries."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC)
            .isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(), "logger": record.name,
            "message": record.getMessage(), **_fields(record)}
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = record.stack_info
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``time level logger: message [instrument=ocs1]``: for files and logs that are not a
    terminal."""

    def __init__(self, *, stamp: bool = True) -> None:
        super().__init__(("%(asctime)s " if stamp else "") + "%(levelname)s %(name)s: "
                         "%(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        fields = _fields(record)
        if fields:
            text += " [" + " ".join(f"{k}={v}" for k, v in fields.items()) + "]"
        return text


def _rich_handler(stream: IO[str]) -> logging.Handler:
    from rich.console import Console
    from rich.logging import RichHandler

    class _Handler(RichHandler):
        def render_message(self, record: logging.LogRecord, message: str) -> Any:
            fields = _fields(record)
            if fields:
                message += " [" + " ".join(f"{k}={v}" for k, v in fields.items()) + "]"
            return super().render_message(record, message)

    # markup off: messages quote device replies and lab-file sections ([[host]]).
    return _Handler(console=Console(file=stream, stderr=stream is sys.stderr),
                    show_path=False, markup=False, rich_tracebacks=False,
                    log_time_format="%H:%M:%S.%f")


def _handler_for(stream: IO[str], fmt: LogFormat) -> logging.Handler:
    if fmt == "json":
        handler: logging.Handler = logging.StreamHandler(stream)
        handler.setFormatter(JsonFormatter())
    elif stream.isatty():
        handler = _rich_handler(stream)
    else:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(TextFormatter())
    return handler


def configure(level: str = "warning", fmt: str = "human", file: str | Path | None = None, *,
              max_bytes: int = 10 << 20, backups: int = 5, stream: IO[str] | None = None,
              secrets: Iterable[str | None] = ()) -> None:
    """Set up this process's logs (again, if they were): ``level`` as
    :func:`parse_levels` reads it, ``fmt`` ``human`` or ``json``, to ``file`` (rotated at
    ``max_bytes``, ``backups`` kept) instead of ``stream`` (stderr) where given.
    LogSettingsError for an option that cannot be used, before anything changes."""
    root_level, levels = parse_levels(level)
    if fmt not in FORMATS:
        raise LogSettingsError(f"log format {fmt!r}: expected one of {', '.join(FORMATS)}")
    add_secrets(*secrets)
    handler: logging.Handler
    if file is not None:
        try:
            handler = logging.handlers.RotatingFileHandler(
                file, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        except OSError as exc:
            raise LogSettingsError(f"log file {file}: {exc.strerror or exc}") from None
        handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    else:
        handler = _handler_for(stream or sys.stderr, fmt)  # type: ignore[arg-type]
    handler.addFilter(_Redacting())
    handler.set_name(_HANDLER)
    root = logging.getLogger()
    # Only the handler an earlier call installed: others (a test runner's) are not ours.
    for old in [h for h in root.handlers if h.get_name() == _HANDLER]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(root_level)
    for name in QUIET:
        if not any(_related(name, asked) for asked in levels):
            logging.getLogger(name).setLevel(max(root_level, logging.WARNING))
    for name, value in levels.items():
        logging.getLogger(name).setLevel(value)
    # Python's own warnings (a deprecation in a library) as log lines, in the same format.
    logging.captureWarnings(True)


def _related(quiet: str, asked: str) -> bool:
    """Whether naming ``asked`` in the level asks for the library ``quiet``'s lines."""
    return quiet == asked or quiet.startswith(asked + ".") or asked.startswith(quiet + ".")


class JsonLines(io.TextIOBase):
    """A text stream that writes each line given to it to ``stream`` as a JSON log line
    (``logger``, ``level``): for what a command prints, where logs are JSON."""

    def __init__(self, stream: IO[str], logger: str, level: str = "info") -> None:
        self.stream, self.logger, self.level = stream, logger, level
        self._pending = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False  # no colours nor cursor moves: what is written is read as text

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            *lines, self._pending = self._pending.split("\n")
            for line in lines:
                self._line(line)
        return len(text)

    def _line(self, line: str) -> None:
        if not line.strip():
            return  # a blank line is layout, not a message
        record = logging.LogRecord(self.logger, LEVELS.get(self.level, logging.INFO),
                                   "", 0, redact(line.strip()), None, None)
        self.stream.write(JsonFormatter().format(record) + "\n")

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                self._line(self._pending)
                self._pending = ""
        self.stream.flush()


def json_consoles(out: Any, err: Any, logger: str) -> None:
    """Make two rich consoles (stdout's and stderr's; duck-typed, so that this module loads
    no rich) write JSON lines: ``out``'s at ``info``, ``err``'s at ``error``. Soft wrap: a
    long line stays one message."""
    for console, stream, level in ((out, sys.stdout, "info"), (err, sys.stderr, "error")):
        console.file = JsonLines(stream, logger, level)
        console.soft_wrap = True


def level_for(verbose: int, spec: str | None) -> str:
    """The level option a command uses: ``spec`` as given, else ``-v`` (info) or ``-vv``
    (debug), else warnings and errors only."""
    if spec:
        return spec
    return "warning" if verbose <= 0 else "info" if verbose == 1 else "debug"

