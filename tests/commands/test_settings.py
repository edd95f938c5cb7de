"""The daemon's settings in one place: defaults, the settings file, LABD_* and flags, each
over the one before; `labd config show` says where each value came from; a bad value is
one message naming the setting and its source."""

import asyncio
import json
import os
import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labd import deadlines
from labd.settings import (
    NAMES,
    SettingsError,
    check_table,
    daemon_table,
    env_name,
    layered,
    mask_url,
    resolve,
)
from tests.commands.running import Running
from tests.labs import switch, write_lab

LABD = [sys.executable, "-m", "labd"]


async def labd(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    # Only the variables the test sets, of those labd reads: the suite's own environment
    # may hold LABD_* of its own.
    base = {k: v for k, v in os.environ.items() if not k.startswith("LABD_")}
    proc = await asyncio.create_subprocess_exec(
        *LABD, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**base, "COLUMNS": "200", **(env or {})})
    try:
        async with asyncio.timeout(deadlines.current().of("process_ready")):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def test_each_source_over_the_one_before() -> None:
    resolved = resolve(
        files=[("lab.toml", {"port": 9001, "db": "lab.sqlite", "host": "10.0.0.1"}),
               ("labd.toml", {"port": 9002})],
        env={"LABD_DB": "env.sqlite", "LABD_HOST": "10.0.0.2", "LABD_MQTT": " "},
        flags={"host": "10.0.0.3", "mqtt": None})
    s = resolved.settings
    assert (s.port, s.db, s.host, s.mqtt) == (9002, "env.sqlite", "10.0.0.3", None)
    assert resolved.where["port"] == "file labd.toml"  # the installation's over the lab's
    assert resolved.where["db"] == "env LABD_DB"
    assert resolved.where["host"] == "flag --host"
    # An empty variable and an option not given leave the default.
    assert resolved.source("mqtt") == "default" and resolved.source("restore") == "default"
    assert (s.lease_renew_s, s.lease_ttl_s, s.ha_url) == (0.5, 2.0, None)


def test_layered_puts_the_lab_under_the_settings_file(tmp_path: Path) -> None:
    """The one order every command resolves in (labd run, config show, the assembly):
    the lab's table, then --config's, then LABD_*, then flags."""
    config = tmp_path / "labd.toml"
    config.write_text('[daemon]\nport = 9002\nrestore = false\n')
    resolved = layered(("lab.toml", {"port": 9001, "db": "lab.sqlite", "host": "10.0.0.1"}),
                       config=config, env={"LABD_RESTORE": "true"},
                       flags={"host": "10.0.0.3"})
    s = resolved.settings
    assert (s.port, s.db, s.host, s.restore) == (9002, "lab.sqlite", "10.0.0.3", True)
    assert [resolved.where[n] for n in ("port", "db", "host", "restore", "mqtt")] == [
        f"file {config}", "file lab.toml", "flag --host", "env LABD_RESTORE", "default"]


def test_a_table_is_checked_apart_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A lab file's [daemon] table is checked on its own: a bad LABD_PORT in this
    process's environment is not the file's problem, and env={} leaves it out."""
    monkeypatch.setenv("LABD_PORT", "eighty")
    assert check_table({"db": "x.sqlite"}) == []
    assert resolve(files=[("a.toml", {"port": 1})], env={}).settings.port == 1
    with pytest.raises(SettingsError, match="from env LABD_PORT"):
        resolve(files=[("a.toml", {"port": 1})])


def test_environment_values_are_read_as_their_types() -> None:
    s = resolve(env={"LABD_PORT": "8471", "LABD_OPEN_READS": "true", "LABD_RESTORE": "0",
                     "LABD_WATCH_INTERVAL_S": "0.5", "LABD_LOG_FORMAT": "json"}).settings
    assert (s.port, s.open_reads, s.restore, s.watch_interval_s, s.log_format) == (
        8471, True, False, 0.5, "json")
    assert resolve(env={"LABD_CPU": "auto"}).settings.cpu == "auto"
    assert resolve(env={"LABD_CPU": "1"}).settings.cpu == 1
    assert resolve(files=[("a.toml", {"cpu": 0})]).settings.cpu == 0


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"env": {"LABD_PORT": "84x"}}, "setting port = '84x' (from env LABD_PORT)"),
    ({"env": {"LABD_PORT": "70000"}}, "setting port = '70000' (from env LABD_PORT)"),
    ({"files": [("a.toml", {"prot": 1})]}, "a.toml [daemon]: no setting 'prot' (did you "
                                            "mean 'port'?)"),
    ({"flags": {"log_level": "info,labd.fabric=loud"}},
     "setting log_level = 'info,labd.fabric=loud' (from flag --log-level): 'loud' is no "
     "level"),
    ({"env": {"LABD_LEASE_RENEW_S": "3"}},
     "lease_renew_s (3) must be at most half lease_ttl_s (2)"),
    ({"files": [("a.toml", {"tls_cert": "c.pem"})]}, "tls_cert and tls_key go together"),
    ({"env": {"LABD_OPEN_READS": "perhaps"}}, "(from env LABD_OPEN_READS)"),
    ({"env": {"LABD_CPU": "fast"}}, "setting cpu = 'fast' (from env LABD_CPU)"),
    ({"flags": {"cpu": "-1"}}, "setting cpu = '-1' (from flag --cpu)"),
])
def test_a_bad_value_names_the_setting_and_its_source(kwargs: dict, expected: str) -> None:
    with pytest.raises(SettingsError) as caught:
        resolve(**kwargs)
    assert expected in str(caught.value)


def test_settings_files_and_their_mistakes(tmp_path: Path) -> None:
    good = tmp_path / "labd.toml"
    good.write_text('[daemon]\nport = 9100\nmqtt = "mqtt://broker:1883"\n')
    assert daemon_table(good, required=True) == {"port": 9100, "mqtt": "mqtt://broker:1883"}
    flat = tmp_path / "flat.toml"
    flat.write_text("port = 9100\n")
    with pytest.raises(SettingsError, match=r"flat.toml: the settings go under a \[daemon\]"):
        daemon_table(flat, required=True)
    broken = tmp_path / "broken.toml"
    broken.write_text("[daemon\nport = 1\n")
    with pytest.raises(SettingsError, match=r"broken\.toml: not valid TOML"):
        daemon_table(broken)
    with pytest.raises(SettingsError, match=r"missing\.toml: no such settings file"):
        daemon_table(tmp_path / "missing.toml")
    lab = tmp_path / "lab.toml"
    lab.write_text('[lab]\nname = "x"\n')
    assert daemon_table(lab) is None  # a lab file without [daemon] has no settings


def test_passwords_in_urls_are_masked() -> None:
    assert mask_url("postgresql://labd:hunter2@db:5432/labd") == \
        "postgresql://labd:***@db:5432/labd"
    assert mask_url("mqtt://broker:1883") == "mqtt://broker:1883"
    shown = resolve(env={"LABD_DB": "postgresql://labd:hunter2@db/labd"}).shown("db")
    assert "hunter2" not in shown and "labd:***@db" in shown


@given(st.sampled_from(NAMES), st.text(max_size=40))
def test_any_environment_value_is_a_setting_or_one_clear_message(name: str,
                                                                 raw: str) -> None:
    try:
        resolved = resolve(env={env_name(name): raw})
    except SettingsError as exc:
        message = str(exc)
        assert message.startswith("bad settings:")
        assert env_name(name) in message  # names where the bad value came from
    else:
        if raw.strip():
            assert resolved.source(name) == "env"
        else:
            assert resolved.source(name) == "default"


async def test_config_show_says_where_each_setting_came_from(tmp_path: Path) -> None:
    _, lab = write_lab(tmp_path, "cfg", switch())
    config = tmp_path / "labd.toml"
    config.write_text('[daemon]\nport = 9123\nlog_format = "json"\n')
    code, out, err = await labd(
        "config", "show", str(lab), "--config", str(config), "--host", "0.0.0.0", "--json",
        env={"LABD_DB": "postgresql://labd:db-pass-77@db/labd", "LABD_TOKEN": "tok-show-88"})
    assert code == 0, err
    shown = json.loads(out)
    assert shown["port"] == {"value": "9123", "source": "file", "from": f"file {config}"}
    assert shown["db"] == {"value": "postgresql://labd:***@db/labd", "source": "env",
                           "from": "env LABD_DB"}
    assert shown["host"] == {"value": "0.0.0.0", "source": "flag", "from": "flag --host"}
    assert shown["log_format"]["source"] == "file"
    assert shown["mqtt"] == {"value": "(none)", "source": "default", "from": "default"}
    assert shown["token"]["value"] == "***"
    assert "db-pass-77" not in out + err and "tok-show-88" not in out + err
    # The table a person reads says the same.
    code, out, err = await labd("config", "show", "--config", str(config), "--port", "9200",
                                env={"LABD_HOST": "10.1.2.3"})
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert rows["port"][1:3] == ["9200", "flag"]
    assert rows["host"][1:3] == ["10.1.2.3", "env"]
    assert rows["log_format"][1:3] == ["json", "file"]
    assert rows["restore"][1:3] == ["true", "default"]


async def test_bad_settings_stop_labd_run_with_one_message(tmp_path: Path) -> None:
    _, lab = write_lab(tmp_path, "cfg", switch())
    code, out, err = await labd("run", str(lab), "--db", str(tmp_path / "s.sqlite"),
                                env={"LABD_PORT": "eighty"})
    assert code == 2
    assert "setting port = 'eighty' (from env LABD_PORT)" in err
    assert "Traceback" not in err + out
    config = tmp_path / "bad.toml"
    config.write_text('[daemon]\nlease_ttl_s = "soon"\n')
    code, out, err = await labd("run", str(lab), "--config", str(config))
    assert code == 2 and f"(from file {config})" in err.replace("\n", "")
    assert "Traceback" not in err + out


async def test_the_lab_files_daemon_table_is_a_file_source_under_config(
        tmp_path: Path) -> None:
    _, lab = write_lab(tmp_path, "cfg", '[daemon]\nport = 9300\nlog_format = "json"\n',
                       switch())
    code, out, err = await labd("config", "show", str(lab), "--json",
                                env={"LABD_METRICS_NEED_KEY": "true"})
    assert code == 0, err
    shown = json.loads(out)
    assert shown["port"] == {"value": "9300", "source": "file", "from": f"file {lab}"}
    assert shown["log_format"] == {"value": "json", "source": "file", "from": f"file {lab}"}
    assert shown["metrics_need_key"] == {"value": "true", "source": "env",
                                         "from": "env LABD_METRICS_NEED_KEY"}
    # The installation's --config over the lab's table, setting by setting.
    config = tmp_path / "labd.toml"
    config.write_text("[daemon]\nport = 9301\n")
    code, out, err = await labd("config", "show", str(lab), "--config", str(config), "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["port"] == {"value": "9301", "source": "file", "from": f"file {config}"}
    assert shown["log_format"]["from"] == f"file {lab}"
    assert shown["metrics_need_key"]["source"] == "default"
    # A misspelt setting in the lab's table: one line naming the file, the table and the
    # closest setting.
    _, bad = write_lab(tmp_path, "cfg", "[daemon]\nprot = 9300\n", switch(), file="bad.toml")
    code, out, err = await labd("config", "show", str(bad))
    assert code == 2
    assert "no setting 'prot' (did you mean 'port'?)" in " ".join(err.split())
    assert "Traceback" not in out + err


async def test_metrics_need_a_key_where_the_setting_says(tmp_path: Path) -> None:
    """labd run with --metrics-need-key, the rest of its settings from the lab file's
    [daemon] table: /metrics refuses a request without a key, and serves a viewer's."""
    viewer, admin = "viewer-key-0a1b2c3d4e", "admin-key-5f6a7b8c9d"
    access = tmp_path / "access.toml"
    access.write_text(f'[[key]]\nname = "prometheus"\nrole = "viewer"\ntoken = "{viewer}"\n'
                      f'[[key]]\nrole = "admin"\ntoken = "{admin}"\n')
    access.chmod(0o600)
    _, lab = write_lab(tmp_path, "metrics-key",
                       f'[daemon]\nport = 0\ndb = "{tmp_path / "s.sqlite"}"\n', switch())
    daemon = await Running.start(str(lab), "--access", str(access), "--metrics-need-key",
                                 env={"LABD_TOKEN": admin})
    try:
        async with httpx.AsyncClient(base_url=await daemon.url()) as http:
            refused = await http.get("/metrics")
            wrong = await http.get("/metrics", headers={"Authorization": "Bearer not-a-key"})
            served = await http.get("/metrics",
                                    headers={"Authorization": f"Bearer {viewer}"})
        assert await daemon.stop(timeout=deadlines.current().times(10)) == 0
    finally:
        await daemon.close()
    assert refused.status_code == 401 and wrong.status_code == 401
    assert served.status_code == 200 and "labd_instrument_up" in served.text


#: TOML that tomllib reads only by raising what it is not meant to: an integer of 5,000
#: digits (Python's int-string limit, a ValueError) and inline tables 500 deep (its
#: recursion limit); labd check answered both, labd run and config show gave tracebacks.
UNREADABLE = {"digits": "1" + "0" * 5000,
              "deep": "{ a = " * 500 + "1" + " }" * 500}


@pytest.mark.parametrize("kind", sorted(UNREADABLE))
async def test_every_file_labd_run_reads_is_one_message_whatever_its_toml(
        tmp_path: Path, kind: str) -> None:
    value = UNREADABLE[kind]
    _, lab = write_lab(tmp_path, "unreadable", switch())
    bad_lab = tmp_path / "bad-lab.toml"
    bad_lab.write_text(lab.read_text() + f"\n[daemon]\nport = {value}\n")
    settings_file = tmp_path / "labd.toml"
    settings_file.write_text(f"[daemon]\nport = {value}\n")
    access = tmp_path / "access.toml"
    access.write_text(f"open_reads = {value}\n")
    credentials = tmp_path / "daemon.toml"
    credentials.write_text(f"lab = {value}\n")
    credentials.chmod(0o600)
    run = ("run", str(lab), "--db", str(tmp_path / "s.sqlite"), "--port", "0")
    for args, named in [(("config", "show", str(bad_lab)), bad_lab),
                        (("config", "show", "--config", str(settings_file)), settings_file),
                        (("run", str(bad_lab)), bad_lab),
                        ((*run, "--config", str(settings_file)), settings_file),
                        ((*run, "--access", str(access)), access),
                        ((*run, "--mqtt", "mqtt://127.0.0.1:1", "--mqtt-credentials",
                          str(credentials)), credentials)]:
        code, out, err = await labd(*args)
        assert (code, "Traceback" in out + err) == (2, False), (args, err)
        # One message, naming the file (wrapped by the terminal's width, hence the join).
        assert err.startswith("error: ") and err.count("error:") == 1, (args, err)
        assert str(named) in " ".join(err.split()), (args, err)


@pytest.mark.parametrize("kind", sorted(UNREADABLE))
def test_each_reader_of_toml_answers_it_with_its_own_error(tmp_path: Path, kind: str) -> None:
    from labd.daemon.access import Access
    from labd.errors import AccessError, BusError, LabFileError
    from labd.lab.loader import load_lab
    from labd.mqtt.credentials import read_credentials

    path = tmp_path / "file.toml"
    path.write_text(f"[daemon]\nx = {UNREADABLE[kind]}\n")
    path.chmod(0o600)
    words = "a value cannot be read" if kind == "digits" else "nest too deeply"
    for read, error in [(daemon_table, SettingsError), (Access.load, AccessError),
                        (read_credentials, BusError), (load_lab, LabFileError)]:
        with pytest.raises(error) as caught:
            read(path)
        assert str(path) in str(caught.value) and words in str(caught.value), read


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200),
                 st.builds(lambda key, depth, digits, inline: (
                     f"[daemon]\n{key} = " + ("{ a = " if inline else "[") * depth
                     + "1" * digits + (" }" if inline else "]") * depth + "\n"),
                     st.sampled_from(["port", "db", "x"]), st.integers(0, 2000),
                     st.integers(1, 6000), st.booleans())))
def test_any_settings_file_is_a_table_or_one_clear_message(text: str) -> None:
    """Whatever a settings file holds, daemon_table gives its [daemon] table (or None), or
    one SettingsError line naming the file; and resolve takes the table or refuses it
    in words."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "labd.toml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            table = daemon_table(path)
        except SettingsError as exc:
            assert str(exc).startswith(f"{path}: ") and "\n" not in str(exc)
            return
    if table is not None:
        try:
            resolve(files=[("labd.toml", table)])
        except SettingsError as exc:
            assert "labd.toml" in str(exc)
