"""The daemon's events as the Events tab tells them: one sentence each, in words an
engineer reads at a glance, not the event's data as a dict. An event this module does not
know is told by its fields (key: value), never dropped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labd.vocabulary import EventKind, span_ms

Data = dict[str, Any]


def _pairs(pairs: Any) -> str:
    return ", ".join(f"{a}→{b}" for a, b in pairs or [])


def _reconfiguration(d: Data) -> str:
    changed = []
    if d.get("connected"):
        changed.append(f"connected {_pairs(d['connected'])}")
    if d.get("disconnected"):
        changed.append(f"disconnected {_pairs(d['disconnected'])}")
    total = span_ms(d, "requested", "done")
    took = "" if total is None else f" in {total:.1f} ms"
    outcome = d.get("outcome")
    said = f"{d.get('switch')}: {' and '.join(changed) or 'nothing changed'}{took}"
    said += f" ({d.get('cause')}, reconfiguration #{d.get('id')})"
    if outcome != "ok":
        said += f": {outcome}" + (f", {d['error']}" if d.get("error") else "")
    return said


def _failover(d: Data) -> str:
    plan = d.get("plan") or {}
    spare = plan.get("spare")
    what = f"job {d.get('job')}: {d.get('trigger')} on {d.get('member')}"
    if spare:
        what += f", spare {spare}"
    outcome = d.get("outcome")
    offsets = d.get("since_failure_ms") or {}
    reached = [stage for stage, ms in offsets.items() if ms is not None]
    if outcome == "in-progress":
        last = reached[-1].replace("_", " ") if reached else "reported"
        what += f": recovering ({last} at {offsets.get(reached[-1], 0):.1f} ms)" \
            if reached else ": recovering"
    else:
        what += f": {outcome}"
        if d.get("detail"):
            what += f" ({d['detail']})"
        first = offsets.get("first_step")
        if first is not None:
            what += f", first step {first:.1f} ms after the failure"
    if d.get("id") is not None:
        what += f" (failover #{d['id']})"
    return what


def _drill(d: Data) -> str:
    state = d.get("state")
    said = f"drill on job {d.get('job')} ({d.get('kind')}): {state}"
    if d.get("member"):
        said += f", member {d['member']}"
    if d.get("outcome"):
        said += f", {d['outcome']}"
    if d.get("detail"):
        said += f": {d['detail']}"
    return said


def _job_state(d: Data) -> str:
    said = f"job {d.get('id')} {d.get('status')} (epoch {d.get('epoch')}), members " \
           f"{', '.join(d.get('members') or []) or 'none'}"
    if d.get("spares"):
        said += f"; spares {', '.join(d['spares'])}"
    if d.get("awaiting_decision") is not None:
        said += f"; failover #{d['awaiting_decision']} awaits the operator"
    return said


def _job_progress(d: Data) -> str:
    said = f"job {d.get('job')} rank {d.get('rank')} on {d.get('host')}: {d.get('progress')}"
    if d.get("step") is not None:
        said += f" {d['step']}"
    if d.get("code") is not None:
        said += f" (exit code {d['code']})"
    return said


def _host(d: Data) -> str:
    return f"host {d.get('host')} is {d.get('status')} (was {d.get('was')})"


def _gpu(d: Data) -> str:
    said = f"host {d.get('host')} GPU {d.get('gpu')} is {d.get('health')}"
    if d.get("was"):
        said += f" (was {d['was']})"
    if d.get("reasons"):
        said += f": {', '.join(map(str, d['reasons']))}"
    return said


def _nic(d: Data) -> str:
    return f"host {d.get('host')} NIC {d.get('nic')} link {'up' if d.get('up') else 'down'}"


def _instrument(d: Data) -> str:
    said = f"{d.get('instrument')}: {d.get('kind')}"
    if d.get("state"):
        said += f" {d['state']}"
    if d.get("detail"):
        said += f" ({d['detail']})"
    if d.get("restarted"):
        said += ", it had restarted"
    return said


def _drift(d: Data) -> str:
    said = f"{d.get('switch')} holds other circuits than intended (at {d.get('when')})"
    if d.get("missing"):
        said += f"; missing {_pairs(d['missing'])}"
    if d.get("unexpected"):
        said += f"; not asked for {_pairs(d['unexpected'])}"
    return said + f"; policy: {d.get('policy')}"


def _job_error(d: Data) -> str:
    return f"job {d.get('job')} rank {d.get('rank')} on {d.get('host')} failed: {d.get('error')}"


def _detail(d: Data) -> str:
    return str(d.get("detail", "")) or _fields(d)


def _fields(d: Data) -> str:
    return "; ".join(f"{k}: {v}" for k, v in d.items()) or "(no details)"


K = EventKind
TOLD: dict[str, Callable[[Data], str]] = {
    K.RECONFIGURATION: _reconfiguration, K.FAILOVER: _failover, K.DRILL: _drill,
    K.JOB_STATE: _job_state, K.JOB_PROGRESS: _job_progress, K.JOB_ERROR: _job_error,
    K.HOST_STATUS: _host, K.HOST_LOST: _host, K.GPU_HEALTH: _gpu, K.NIC_LINK: _nic,
    K.DRIFT: _drift, K.WARNING: _detail, K.ERROR: _detail}


def sentence(kind: str, data: Data) -> str:
    """The event in one sentence."""
    told = TOLD.get(kind)
    if told is None and kind.startswith("instrument."):
        told = _instrument
    try:
        return (told or _fields)(data)
    except (KeyError, TypeError, ValueError, AttributeError):
        return _fields(data)  # a shape this module does not expect: its fields, as given
