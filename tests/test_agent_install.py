"""The GPU host's install, the labd-agent distribution, holds all that the agent loads and
none of the server's libraries.

The install is laid out here as pip would lay it, but offline: the distribution's packages
copied from this repository as its pyproject.toml names them, and its requirements (with
what they require in turn) linked from this environment's site-packages. The agent then
runs on that path alone, in a Python started without site-packages (``-S``), so anything it
imports that the distribution does not declare fails the import.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
AGENT_PROJECT = ROOT / "labd-agent" / "pyproject.toml"
#: What `pip install labd` brings for the daemon, the store and the TUI, and a GPU host
#: must not need.
SERVER = {"fastapi", "uvicorn", "sqlalchemy", "alembic", "psycopg", "textual", "numpy",
          "starlette", "httptools", "uvloop"}


def _agent() -> dict[str, Any]:
    with AGENT_PROJECT.open("rb") as f:
        return tomllib.load(f)


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def test_the_agent_declares_the_whole_labds_own_requirements() -> None:
    agent = _agent()
    with (ROOT / "pyproject.toml").open("rb") as f:
        root = tomllib.load(f)["project"]
    project = agent["project"]
    # Same bounds as the whole labd's, so the two installs never disagree on a version.
    assert set(project["dependencies"]) <= set(root["dependencies"])
    assert project["optional-dependencies"]["nvml"] == root["optional-dependencies"]["nvml"]
    assert project["version"] == root["version"]
    assert project["requires-python"] == root["requires-python"]
    assert project["scripts"]["labd-agent"] == root["scripts"]["labd-agent"]
    assert not {_name(r) for r in project["dependencies"]} & SERVER


def _closure(requirements: list[str]) -> set[str]:
    """The installed distributions that ``requirements`` need, transitively (markers
    evaluated for this Python, extras left out)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(Requirement(r) for r in metadata.distribution(name).requires or [])
    return seen


def _link_distribution(name: str, into: Path) -> set[str]:
    """Link a distribution's top-level modules and its metadata into ``into``; returns the
    top-level names it provides."""
    dist = metadata.distribution(name)
    tops: set[str] = set()
    for file in dist.files or []:
        parts = Path(str(file)).parts
        if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith(".pth"):
            continue
        source = Path(str(dist.locate_file(parts[0])))
        target = into / parts[0]
        if not target.exists():
            target.symlink_to(source, target_is_directory=source.is_dir())
        tops.add(parts[0].split(".")[0])
    return tops


def _install(into: Path) -> list[str]:
    """Copy the distribution's packages as setuptools lays them out; returns the modules."""
    tool = _agent()["tool"]["setuptools"]
    source = (AGENT_PROJECT.parent / tool["package-dir"][""]).resolve()
    modules = []
    for package in tool["packages"]:
        folder = source.joinpath(*package.split("."))
        (into / folder.relative_to(source)).mkdir(parents=True, exist_ok=True)
        for file in sorted(folder.glob("*.py")):
            shutil.copy2(file, into / file.relative_to(source))
            stem = file.stem
            modules.append(package if stem == "__init__" else f"{package}.{stem}")
    return modules


def _imported(files: list[Path]) -> set[str]:
    """Every module the files import, at the top or inside a function."""
    names: set[str] = set()
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


#: Run on the install alone: import every module of the agent and each labd module they
#: import anywhere (function-level imports included), run the command's --help, and say
#: what was loaded.
PROBE = """
import importlib, json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
for name in json.loads(sys.argv[3]):
    importlib.import_module(name)
from labd.agent.cli import main
sys.argv = ["labd-agent", "--help"]
try:
    main()
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
print(json.dumps({"modules": sorted(sys.modules),
                  "labd": importlib.import_module("labd").__file__}))
"""


def test_the_agent_runs_on_its_own_install_alone(tmp_path: Path) -> None:
    site, deps = tmp_path / "install", tmp_path / "requirements"
    site.mkdir()
    deps.mkdir()
    project = _agent()["project"]
    shipped = set(_install(site))
    provided: set[str] = set()
    for name in sorted(_closure(project["dependencies"])):
        provided |= _link_distribution(name, deps)

    # The agent's modules and every labd module they import, anywhere in them.
    agent_files = sorted((site / "labd" / "agent").glob("*.py"))
    wanted = sorted(m for m in _imported(agent_files) if m in shipped)
    agent_modules = sorted(m for m in shipped if m.startswith("labd.agent")
                           and m != "labd.agent.__main__")
    # A labd module the agent imports that the distribution does not ship is named here.
    labd_wanted = {m for m in _imported(agent_files) if m.startswith("labd.")
                   and not any(m == s or m.startswith(s + ".") for s in shipped)
                   and m.rpartition(".")[0] not in shipped}
    assert not labd_wanted, f"the agent imports modules labd-agent does not ship: {labd_wanted}"

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run(
        [sys.executable, "-S", "-c", PROBE, str(site), str(deps),
         json.dumps(agent_modules + wanted)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["labd"].startswith(str(site)), "the agent ran on another labd than its own"
    tops = {m.split(".")[0] for m in answer["modules"]}
    assert not tops & SERVER, f"the agent loaded server libraries: {sorted(tops & SERVER)}"
    # Everything loaded is the standard library's, the distribution's or a requirement's.
    foreign = {t for t in tops - set(sys.stdlib_module_names) - {"labd", "__main__"}
               if t not in provided and not t.startswith("_")}
    assert not foreign, f"loaded from outside the agent's requirements: {sorted(foreign)}"
    # Function-level third-party imports are requirements or the nvml extra's.
    optional = {"pynvml"}
    third = {m.split(".")[0] for m in _imported(agent_files)} - set(sys.stdlib_module_names)
    assert third - {"labd"} - optional <= provided
