"""Completion of values: an option's choices, lab names, kept runs and a lab file's
switches, asked as a shell asks (the completion protocol on the built command tree)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import typer.main
from typer._click.shell_completion import get_completion_class  # typer's own click

from labd.commands.complete import attach
from labd.commands.main import app


def complete(words: str, incomplete: str = "") -> list[str]:
    command = attach(typer.main.get_command(app))
    bash = get_completion_class("bash")
    assert bash is not None
    asked = bash(command, {}, "labd", "_LABD_COMPLETE")
    return [item.value for item in asked.get_completions(words.split(), incomplete)]


def test_choices_complete() -> None:
    assert complete("measure reconfig --pattern") == ["toggle", "random", "permutation",
                                                      "sweep"]
    assert complete("measure reconfig --pattern", "p") == ["permutation"]
    assert complete("measure failover --format") == ["png", "svg", "pdf"]
    assert complete("run demo --log-format") == ["human", "json"]
    assert "xid79" in complete("measure failover --signal", "x")
    assert complete("agent --backend", "nv") == ["nvml", "nvidia-smi"]


def test_log_levels_complete_each_part() -> None:
    assert complete("run demo --log-level", "w") == ["warning"]
    assert complete("run demo --log-level", "info,labd.fabric=d") == ["info,labd.fabric=debug"]


def test_lab_names_complete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rack-a.toml").write_text("")
    (tmp_path / "notes.txt").write_text("")
    monkeypatch.chdir(tmp_path)
    found = complete("run")
    assert {"demo", "failover", "rack-a.toml"} <= set(found) and "notes.txt" not in found
    assert complete("check", "fa") == ["failover"]
    assert complete("measure reconfig --lab", "de") == ["demo"]


def test_kept_runs_complete_and_no_store_is_made(tmp_path: Path) -> None:
    store = tmp_path / "runs.sqlite"
    assert complete(f"measure show --runs {store}") == []
    assert not store.exists()  # asking made none
    with sqlite3.connect(store) as db:
        db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)")
        db.executemany("INSERT INTO runs (name) VALUES (?)",
                       [("reconfig-a",), ("failover-b",), ("reconfig-c",)])
    assert complete(f"measure show --runs {store}", "reconfig") == ["reconfig-c",
                                                                    "reconfig-a"]
    assert complete(f"measure compare --runs {store} reconfig-a", "f") == ["failover-b"]
    assert complete(f"measure reconfig --runs {store} --resume", "f") == ["failover-b"]


def test_switches_of_the_lab_complete() -> None:
    found = complete("measure reconfig --lab demo --switch")
    assert found and all(name.startswith(("ocs", "mesh")) for name in found), found
    assert complete("measure reconfig --switch") == []  # no lab given: nothing to read
    assert complete("measure reconfig --lab no-such-lab --switch") == []
