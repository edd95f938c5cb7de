"""The agent's GPU health: captured nvidia-smi outputs, error exits, Xid lines, the rules."""

import stat
from pathlib import Path

import pytest

from labd.agent.health import GpuStatus, Health, classify, classify_host, parse_xid
from labd.agent.smi import apply_remap, interpret_exit, parse_query_gpu, query
from labd.errors import SmiError

DATA = Path(__file__).parent.parent / "data" / "nvidia-smi"


def test_captured_query_with_not_available_fields() -> None:
    gpus = parse_query_gpu((DATA / "h100x4_query.csv").read_text())
    apply_remap(gpus, (DATA / "h100x4_remap.csv").read_text())
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[0].bus_id == "00000000:18:00.0" and gpus[0].power_w == pytest.approx(71.52)
    assert gpus[0].retired_pending is None  # [N/A] on Hopper: no page retirement there
    assert gpus[1].ecc_uncorrected == 2
    assert gpus[2].throttle_reasons == 0x48 and gpus[2].remap_pending is True
    assert gpus[3].temperature_c is None and gpus[3].power_w is None  # [N/A], [Not Supported]
    assert gpus[3].remap_failed is True
    verdicts = [classify(g) for g in gpus]
    assert [v.health for v in verdicts] == [Health.HEALTHY, Health.FAILED, Health.DEGRADED,
                                            Health.FAILED]
    assert verdicts[1].reasons == ("2 uncorrectable ECC error(s)",)
    assert "row remap pending (needs a GPU reset)" in verdicts[2].reasons
    assert "hardware slowdown (throttle reasons 0x48)" in verdicts[2].reasons
    assert verdicts[3].reasons == ("row remapping failed",)


def test_output_with_header_and_units_is_read_too() -> None:
    (gpu,) = parse_query_gpu((DATA / "v100_with_units.csv").read_text())
    assert gpu.power_w == pytest.approx(56.12) and gpu.utilization_pct == 3
    assert gpu.retired_pending is True and gpu.throttle_reasons == 0x1  # idle: not a slowdown
    assert classify(gpu).health is Health.DEGRADED


def test_malformed_rows_are_clear_errors() -> None:
    with pytest.raises(SmiError, match="has 3 fields, expected 10"):
        parse_query_gpu("0, GPU-x, H100\n")


def test_error_exits() -> None:
    lost = interpret_exit(15, (DATA / "gpu_lost.txt").read_text())
    assert lost is not None and lost.lost and "exit 15 (GPU is lost)" in str(lost)
    none = interpret_exit(6, "No devices were found\n")
    assert none is not None and none.lost and "found no GPUs" in str(none)
    mismatch = interpret_exit(18, "Failed to initialize NVML: Driver/library version mismatch\n")
    assert mismatch is not None and not mismatch.lost and "version mismatch" in str(mismatch)
    assert interpret_exit(0, "0, GPU-x, ...") is None


def test_xid_lines_and_critical_codes() -> None:
    line = ("[ 1234.5678] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.")
    assert parse_xid(line) == ("0000:3b:00", 79)
    assert parse_xid("kernel: usb 1-1: new device") is None
    assert classify(GpuStatus(0, xids=[79])).health is Health.FAILED
    assert classify(GpuStatus(0, xids=[13])).health is Health.HEALTHY  # an application fault


def test_missing_gpus_count_as_failed() -> None:
    verdicts = classify_host([GpuStatus(0), GpuStatus(2)], expected=4)
    assert {i: v.health for i, v in verdicts.items()} == {
        0: Health.HEALTHY, 2: Health.HEALTHY, 1: Health.FAILED, 3: Health.FAILED}
    assert verdicts[1].reasons == ("GPU missing",)


def fake_smi(tmp_path: Path, query_out: Path, exit_code: int = 0) -> str:
    """An executable standing in for nvidia-smi that prints a captured output."""
    script = tmp_path / "nvidia-smi"
    script.write_text(f"""#!/bin/sh
case "$1" in
  --query-remapped-rows*) cat {DATA / 'h100x4_remap.csv'} ;;
  *) cat {query_out}; exit {exit_code} ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


async def test_query_runs_the_binary(tmp_path: Path) -> None:
    result = await query(fake_smi(tmp_path, DATA / "h100x4_query.csv"))
    assert len(result.gpus) == 4 and not result.lost_any
    assert result.gpus[2].remap_pending is True
    with pytest.raises(SmiError, match="not found"):
        await query(str(tmp_path / "no-such-binary"))
    lost = await query(fake_smi(tmp_path, DATA / "gpu_lost.txt", exit_code=15))
    assert lost.lost_any and lost.gpus == []
