"""The Containerfile, the compose file and the systemd units against the CLI: every labd
command and option they run exists, and every ``LABD_*`` variable they set is a setting.
No container engine with a compose plugin runs where these tests run, so the files are
read, not built: this is what can go wrong in them without one (a renamed option, a
setting that is no more)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main

from labd.commands.main import app
from labd.settings import NAMES, env_name

DEPLOY = Path(__file__).parents[2] / "deploy"
#: LABD_* variables that are no setting of the daemon's: the build's commit
#: (labd.build), and the agent unit's own, which it passes on its command line.
NOT_SETTINGS = {"LABD_COMMIT", "LABD_LAB", "LABD_MQTT", "LABD_AGENT_ARGS"}


def check_command(argv: list[str]) -> None:
    """``argv`` (``labd ...``) names an existing command, and only options it takes, with
    no more positional arguments than it has."""
    assert Path(argv[0]).name == "labd", argv
    # Duck-typed: typer may bring a click of its own.
    command: Any = typer.main.get_command(app)
    rest = argv[1:]
    while hasattr(command, "commands") and rest:
        sub = command.commands.get(rest[0])
        assert sub is not None, f"labd has no command {rest[0]!r}: {shlex.join(argv)}"
        command, rest = sub, rest[1:]
    options = {name: param for param in command.params if param.param_type_name == "option"
               for name in (*param.opts, *param.secondary_opts)}
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    positional = 0
    words = iter(rest)
    for word in words:
        if word.startswith("-"):
            name = word.split("=", 1)[0]
            assert name in options, f"{command.name} takes no {name}: {shlex.join(argv)}"
            if not options[name].is_flag and not options[name].count and "=" not in word:
                next(words, None)  # its value
        else:
            positional += 1
    assert positional <= sum(max(a.nargs, 1) if a.nargs > 0 else 99 for a in arguments), \
        f"too many arguments for labd {command.name}: {shlex.join(argv)}"


def check_environment(names: list[str], where: str) -> None:
    settings = {env_name(name) for name in NAMES}
    unknown = [n for n in names if n.startswith("LABD_") and n not in settings | NOT_SETTINGS]
    assert not unknown, f"{where} sets {unknown}, which are no labd settings"


def instructions(path: Path) -> list[tuple[str, str]]:
    """A Containerfile's instructions (``KEYWORD``, the rest), continued lines joined."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in (raw.strip() for raw in text.splitlines())
            if line and not line.startswith("#") and " " in line]


def exec_form(text: str) -> list[str]:
    words: list[str] = json.loads(text)
    return words


def test_the_containerfile_runs_labd_as_it_is() -> None:
    found = instructions(DEPLOY / "Containerfile")
    entry = exec_form(next(rest for key, rest in found if key == "ENTRYPOINT"))
    cmd = exec_form(next(rest for key, rest in found if key == "CMD"))
    check_command(entry + cmd)
    health = next(rest for key, rest in found if key == "HEALTHCHECK")
    probe = exec_form(health[health.index("CMD") + 3:].strip())
    assert probe[:2] == ["labd", "health"]  # liveness: docs/service.md, "Health"
    check_command(probe)
    env = [name for key, rest in found if key == "ENV"
           for name in re.findall(r"(\w+)=", rest)]
    check_environment(env, "the Containerfile")
    args = [rest.split("=")[0] for key, rest in found if key == "ARG"]
    assert "LABD_COMMIT" in args


def test_the_compose_file_runs_labd_as_it_is() -> None:
    yaml: Any = pytest.importorskip("yaml")
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    labd = compose["services"]["labd"]
    check_environment(list(labd["environment"]), "compose.yaml")
    test = labd["healthcheck"]["test"]
    assert test[0] == "CMD"
    check_command(test[1:])
    if "command" in labd:
        check_command(["labd", "run", *labd["command"]])
    # The settings it gives as files are mounted where it says.
    mounted = {volume.split(":")[1] for volume in labd["volumes"]}
    for name, value in labd["environment"].items():
        if name in ("LABD_MQTT_CREDENTIALS",):
            assert value in mounted, f"{name}={value} is not mounted"
    assert labd["environment"]["LABD_TOKEN_FILE"].removeprefix("/run/secrets/") in \
        labd["secrets"]


@pytest.mark.parametrize("unit", ["labd.service", "labd-agent@.service"])
def test_the_units_run_labd_as_it_is(unit: str) -> None:
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "systemd" / unit).read_text())
    line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    # systemd's specifiers and variables, as they would be filled in: a variable the
    # unit's comment gives an example of (``#   LABD_AGENT_ARGS=--backend nvml``) with it.
    examples = dict(re.findall(r"^#\s+(LABD_\w+)=(\S+(?: [^#\s]\S*)*)", text, re.M))
    command = re.sub(r"\$\{?(\w+)\}?|%i", lambda m: examples.get(m[1] or "", "VALUE")
                     if m[0].startswith("$") and not m[0].startswith("${") else "VALUE",
                     line.removeprefix("ExecStart="))
    words = shlex.split(command)
    check_command(words)


def test_a_wrong_option_is_caught() -> None:
    with pytest.raises(AssertionError, match="takes no --no-such-option"):
        check_command(["labd", "run", "lab.toml", "--no-such-option"])
    with pytest.raises(AssertionError, match="no command"):
        check_command(["labd", "serve"])
    with pytest.raises(AssertionError, match="no labd settings"):
        check_environment(["LABD_NO_SUCH"], "here")
