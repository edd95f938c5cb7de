"""GPU health from ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``.

Values are separated by ``, ``; unsupported fields read ``[N/A]`` or ``[Not Supported]``
(None here). The exit status carries NVML's error codes (15: a GPU is lost), and some
failures only show in the text ("No devices were found").
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from labd.agent.health import GpuStatus
from labd.errors import SmiError

FIELDS = (
    "index", "uuid", "name", "pci.bus_id", "temperature.gpu", "power.draw",
    "utilization.gpu", "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending", "clocks_throttle_reasons.active",
)
#: Queried separately: older drivers do not know these fields and fail the whole query.
REMAP_QUERY = ("--query-remapped-rows=gpu_bus_id,remapped_rows.pending,"
               "remapped_rows.failure")
NOT_AVAILABLE = {"[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", ""}
GPU_LOST = 15
EXIT_MEANINGS = {2: "invalid argument", 3: "not supported", 4: "no permission",
                 6: "not found", 8: "insufficient power", 9: "driver not loaded",
                 10: "timeout", 12: "NVML library not found", 13: "function not found",
                 14: "infoROM corrupted", 15: "GPU is lost", 16: "GPU reset required",
                 17: "blocked by the operating system", 255: "unknown error"}


@dataclass
class SmiResult:
    gpus: list[GpuStatus]
    lost_any: bool = False


def _value(text: str) -> str | None:
    text = text.strip()
    return None if text in NOT_AVAILABLE else text


def _number(text: str) -> float | None:
    value = _value(text)
    if value is None:
        return None
    try:
        return float(value.split()[0])  # tolerates units left in ("45 %", "300.00 W")
    except (ValueError, IndexError):
        return None


def _yes(text: str) -> bool | None:
    value = _value(text)
    return None if value is None else value.lower() in ("yes", "1", "true")


def _hex(text: str) -> int | None:
    value = _value(text)
    if value is None:
        return None
    try:
        return int(value, 16) if value.lower().startswith("0x") else int(value)
    except ValueError:
        return None


def parse_query_gpu(text: str) -> list[GpuStatus]:
    """Rows of the FIELDS query (``noheader``; a header line, if present, is skipped)."""
    gpus = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("index"):
            continue
        cells = [c.strip() for c in line.split(", ")]
        if len(cells) != len(FIELDS):
            raise SmiError(f"nvidia-smi row has {len(cells)} fields, expected "
                           f"{len(FIELDS)}: {line!r}", code=0)
        row = dict(zip(FIELDS, cells, strict=True))
        ecc = _number(row["ecc.errors.uncorrected.volatile.total"])
        gpus.append(GpuStatus(
            index=int(row["index"]), uuid=row["uuid"], name=row["name"],
            bus_id=row["pci.bus_id"].lower(),
            ecc_uncorrected=None if ecc is None else int(ecc),
            retired_pending=_yes(row["retired_pages.pending"]),
            throttle_reasons=_hex(row["clocks_throttle_reasons.active"]),
            temperature_c=_number(row["temperature.gpu"]),
            power_w=_number(row["power.draw"]),
            utilization_pct=_number(row["utilization.gpu"])))
    return gpus


def apply_remap(gpus: list[GpuStatus], text: str) -> None:
    """Merge ``--query-remapped-rows`` rows (bus id, pending, failure) into the GPUs."""
    by_bus = {g.bus_id.lower(): g for g in gpus}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(", ")]
        if len(cells) != 3 or cells[0].lower().startswith("gpu_bus_id"):
            continue
        gpu = by_bus.get(cells[0].lower())
        if gpu is not None:
            gpu.remap_pending = _yes(cells[1])
            gpu.remap_failed = _yes(cells[2])


def interpret_exit(code: int, output: str) -> SmiError | None:
    """An error for a failed nvidia-smi run, or None when it succeeded."""
    if code == 0 and "No devices were found" not in output:
        return None
    if "No devices were found" in output:
        return SmiError("nvidia-smi found no GPUs", code=code or 6, lost=True)
    meaning = EXIT_MEANINGS.get(code, "error")
    detail = output.strip().splitlines()[-1] if output.strip() else ""
    return SmiError(f"nvidia-smi exit {code} ({meaning})" + (f": {detail}" if detail else ""),
                    code=code, lost=code == GPU_LOST or "GPU is lost" in output)


async def query(binary: str = "nvidia-smi", *, timeout: float = 10.0) -> SmiResult:
    """Run the queries; a hanging nvidia-smi is itself a failure signal (§6.2)."""
    async def run(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            binary, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            async with asyncio.timeout(timeout):
                out, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            raise SmiError(f"nvidia-smi did not answer within {timeout:g} s", code=10,
                           lost=True) from None
        return proc.returncode or 0, out.decode(errors="replace")

    try:
        code, out = await run(f"--query-gpu={','.join(FIELDS)}",
                              "--format=csv,noheader,nounits")
    except FileNotFoundError:
        raise SmiError(f"{binary} not found (no NVIDIA driver on this host?)",
                       code=12) from None
    error = interpret_exit(code, out)
    if error is not None and not error.lost:
        raise error
    gpus = parse_query_gpu(out) if error is None else parse_query_gpu(
        "\n".join(line for line in out.splitlines() if line[:1].isdigit()))
    remap_code, remap = await run(REMAP_QUERY, "--format=csv,noheader")
    if remap_code == 0:
        apply_remap(gpus, remap)
    return SmiResult(gpus, lost_any=error is not None)
