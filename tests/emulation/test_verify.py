"""Light verification drills leave the switch as the daemon intends it."""

from pathlib import Path

from labd import deadlines
from labd.emulation.rig import emulated_rig
from labd.emulation.verify import light_drill
from labd.fabric.engine import log_resolution
from labd.lab.loader import load_lab
from labd.lab.wiring import dark_ingress, metered_paths


async def test_a_mesh_light_drill_puts_the_mesh_back(tmp_path: Path) -> None:
    lab = load_lab("demo")
    async with emulated_rig(lab, db=str(tmp_path / "s.sqlite"), mqtt=None, token="t") as rig:
        engine = rig.daemon.engine
        mesh = engine.switches["mesh1"]
        await engine.reconfigure("mesh1", connect=[(5, 14)], verify_light=False)
        path = next(p for p in metered_paths(lab, "mesh1") if p.meter in engine.meters)
        assert mesh.info is not None
        # 20 ms for the command to reach the mesh, on the suite's deadline scale.
        window = deadlines.current().times(0.02)
        errors = await light_drill(
            mesh, engine.meters[path.meter], path, rig.backdoor, 2,
            threshold_dbm=lab.lab.light_threshold_dbm, window_s=window,
            resolution_s=log_resolution(window, 1e-5),
            dark_ingress=dark_ingress(lab, "mesh1", mesh.info.ingress))
        assert len(errors) == 2  # both light events were seen
        # The drill's own paths are gone; the daemon's circuit is where it was.
        assert mesh.expected == {5: 14} == engine.intended["mesh1"]
        assert mesh.paths() is not None and list(mesh.paths()) == [5]  # type: ignore[arg-type]
