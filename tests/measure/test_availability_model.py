"""The availability model: failure profiles, their traces, and what each strategy loses."""

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labd.errors import ProfileError
from labd.measure.availability import plan_replay
from labd.measure.ettr import (
    RESTART_DEFAULTS_S,
    STANDBY_DEFAULT_S,
    ModelInputs,
    Recoveries,
    cost_trace,
    simulate,
    swap_or_wait,
    sweep,
)
from labd.measure.failures import (
    BUILT_IN,
    LLAMA3_405B,
    MAX_EXPECTED_FAILURES,
    TPUV4,
    FailureClass,
    Profile,
    Trace,
    check_expected,
    load_profile,
    poisson_interval,
    profile_from_toml,
    sample_trace,
)

#: A recovery as a rig might measure it: detection 36 s, the switch 18 s, the rest 18 s
#: (round numbers in hours: 0.01, 0.005, 0.005).
STEADY = Recoveries.of({"gpu": [36.0]}, {"gpu": [18.0]}, {"gpu": [18.0]})


def test_the_built_in_profiles_say_what_their_sources_say() -> None:
    llama = BUILT_IN["llama3-405b"]
    assert llama.total() == 466 and llama.gpus == 16_384 and llama.hours == 54 * 24
    unexpected = sum(c.count for c in llama.classes if not c.planned)
    assert unexpected == 419
    gpu = {c.id: c.count for c in llama.classes if c.path == "gpu"}
    assert gpu == {"gpu-faulty": 148, "gpu-hbm3": 72, "gpu-sram": 19, "gpu-gsp": 17}
    assert {c.id for c in llama.other()} == {"network", "unexpected-other", "planned"}
    # One failure every ~2.8 hours on the whole job, as the paper says ("about one every
    # 3 hours").
    assert 2.5 < llama.hours / llama.total() < 3
    tpu = BUILT_IN["tpuv4"]
    machine = next(c for c in tpu.classes if c.id == "machine")
    # 0.08 % of 1,024 machines a day, over 4,096 chips.
    assert math.isclose(tpu.rate(machine) * 4096 * 24, 1024 * 0.0008)


@pytest.mark.parametrize("profile", [LLAMA3_405B, TPUV4], ids=lambda p: p.name)
def test_replayed_counts_per_class_lie_within_their_poisson_interval(profile: Profile) -> None:
    # A job of another size than the source's: the rates scale with GPUs and hours.
    gpus, hours = profile.gpus * 2, profile.hours * 3
    trace = sample_trace(profile, gpus, hours, np.random.default_rng(7))
    counts = trace.counts(len(profile.classes))
    for i, (cls, mean) in enumerate(zip(profile.classes, profile.expected(gpus, hours).values(),
                                        strict=True)):
        low, high = poisson_interval(mean, 0.99)
        assert low <= counts[i] <= high, (cls.id, counts[i], mean, (low, high))
    assert np.all(np.diff(trace.hours) >= 0) and trace.hours.max() <= hours


def test_the_poisson_interval_holds_what_it_says() -> None:
    assert poisson_interval(0) == (0, 0)
    low, high = poisson_interval(100, 0.95)
    assert (low, high) == (81, 120)  # the exact central interval of Poisson(100)
    draws = np.random.default_rng(1).poisson(30, size=20_000)
    low, high = poisson_interval(30, 0.95)
    assert 0.94 < np.mean((draws >= low) & (draws <= high)) < 0.97


def _tiny() -> tuple[Profile, ModelInputs, Trace]:
    profile = Profile("tiny", "a test", 8, 10, (
        FailureClass("gpu", "GPU", 1, "gpu"), FailureClass("sw", "software", 1, "none")))
    inputs = ModelInputs(gpus=8, hours=10, gpus_per_host=8, checkpoint_min=60,
                         restart_s={"all": 360}, standby_s=720, repair_h={"gpu": 2},
                         spares=1)
    # A GPU failure 1.25 h in, a software one 3.5 h in.
    return profile, inputs, Trace(np.array([1.25, 3.5]), np.array([0, 1]))


def test_ettr_of_a_tiny_job_is_what_a_hand_computes() -> None:
    profile, inputs, trace = _tiny()
    outcome = simulate(profile, inputs, STEADY, traces=1, fixed=trace)
    # The GPU failure, hours: detection 0.01, restart 0.1, the 0.25 h since the last hourly
    # checkpoint, and then: the optical swap 0.01 (switch and links); no spare the 2 h
    # repair; a standby 0.2. The software failure: restart 0.1 and 0.5 h redone, alike.
    lost = {"optical": 0.01 + 0.01 + 0.1 + 0.25 + 0.6,
            "no-spare": 0.01 + 2 + 0.1 + 0.25 + 0.6,
            "standby": 0.01 + 0.2 + 0.1 + 0.25 + 0.6}
    for strategy, hours in lost.items():
        # 10 hours of training, and the hours lost beside them on the wall clock.
        assert outcome.ettr[strategy].mean == pytest.approx(10 / (10 + hours))
        assert outcome.gpu_hours_lost[strategy].mean == pytest.approx(hours * 8)
    assert outcome.by_class["sw"]["optical"].mean == pytest.approx(0.6 * 8)
    assert outcome.kept_over["no-spare"].mean == pytest.approx((2 - 0.01) * 8)


def test_without_a_free_spare_a_swap_costs_what_no_spare_costs() -> None:
    profile, inputs, _ = _tiny()
    # Two GPU failures an hour of training apart, the one spare out for 2 h of repair after
    # the first: the second finds none (and waits for its own repair).
    trace = Trace(np.array([1.25, 2.25]), np.array([0, 0]))
    free, lost = swap_or_wait(trace, np.array([True, True]), np.array([2.0, 2.0]), 1,
                              np.array([0.1, 0.1]), np.array([3.0, 3.0]))
    assert free.tolist() == [True, False] and lost.tolist() == [0.1, 3.0]
    # On the wall clock the repair is done once the first failure's loss and the hour of
    # training after it have passed, when the loss is long enough.
    free, _ = swap_or_wait(trace, np.array([True, True]), np.array([2.0, 2.0]), 1,
                           np.array([1.0, 1.0]), np.array([3.0, 3.0]))
    assert free.tolist() == [True, True]
    cost = cost_trace(trace, profile, inputs, STEADY, np.random.default_rng(0))
    assert cost.free["optical"].tolist() == [True, False]
    assert cost.lost_h["optical"][1] == pytest.approx(cost.lost_h["no-spare"][1])
    assert cost.lost_h["optical"][0] < cost.lost_h["no-spare"][0]


def test_no_spare_loses_more_than_the_optical_swap_on_the_same_trace() -> None:
    inputs = ModelInputs(gpus=LLAMA3_405B.gpus, hours=LLAMA3_405B.hours)
    trace = sample_trace(LLAMA3_405B, inputs.gpus, inputs.hours, np.random.default_rng(3))
    cost = cost_trace(trace, LLAMA3_405B, inputs, STEADY, np.random.default_rng(3))
    swapped = np.array([c.path != "none" for c in LLAMA3_405B.classes])[trace.classes]
    assert np.all(cost.lost_h["no-spare"] >= cost.lost_h["optical"])
    assert np.all(cost.lost_h["no-spare"][swapped] > cost.lost_h["optical"][swapped])
    assert cost.lost_h["no-spare"].sum() > cost.lost_h["standby"].sum() > \
        cost.lost_h["optical"].sum()
    # Classes without a recovery path cost the same whichever way.
    assert np.array_equal(cost.lost_h["no-spare"][~swapped], cost.lost_h["optical"][~swapped])


def test_the_sweeps_move_what_they_sweep() -> None:
    inputs = ModelInputs(gpus=LLAMA3_405B.gpus, hours=LLAMA3_405B.hours)
    ocs = sweep("ocs", LLAMA3_405B, inputs, STEADY, traces=20, seed=1)
    optical = [o.ettr["optical"].mean for _, o in ocs]
    assert optical == sorted(optical, reverse=True) and optical[0] > optical[-1]
    assert len({o.ettr["standby"].mean for _, o in ocs}) == 1  # same draws, not swept
    spares = sweep("spares", LLAMA3_405B, inputs, STEADY, traces=20, seed=1)
    none = spares[0][1]
    assert none.ettr["optical"].mean == none.ettr["no-spare"].mean
    assert spares[-1][1].ettr["optical"].mean > none.ettr["optical"].mean
    with pytest.raises(ProfileError, match="sweep 'zoom'"):
        sweep("zoom", LLAMA3_405B, inputs, STEADY)


def test_the_defaults_are_trainmovers() -> None:
    assert sum(RESTART_DEFAULTS_S.values()) == pytest.approx(4.45 * 60)
    assert STANDBY_DEFAULT_S + sum(RESTART_DEFAULTS_S.values()) == pytest.approx(6.47 * 60)
    assert ModelInputs(gpus=16_384, hours=1).spare_hosts == 123  # 6 % of 2,048 hosts


def test_the_replay_drives_each_path_and_compresses_the_run() -> None:
    inputs = ModelInputs(gpus=LLAMA3_405B.gpus, hours=LLAMA3_405B.hours)
    trace = sample_trace(LLAMA3_405B, inputs.gpus, inputs.hours, np.random.default_rng(2))
    plan = plan_replay(LLAMA3_405B, trace, inputs, drive=10, minutes=2, seed=2)
    assert len(plan.failures) == 10
    assert {p.cls.path for p in plan.failures} == {"gpu", "host"}
    assert all(p.cls.path != "none" for p in plan.failures)
    assert [p.at_h for p in plan.failures] == sorted(p.at_h for p in plan.failures)
    assert plan.compression == pytest.approx(54 * 24 * 3600 / 120)
    assert sum(plan.modelled.values()) == len(trace)
    assert plan.failures[-1].at_s(plan.compression) <= 120
    driven = plan.driven()
    assert all(driven[c.id] <= plan.modelled[c.id] for c in LLAMA3_405B.classes)


def test_a_toml_profile_of_counts_or_rates(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\nsource = "our logs"\ngpus = 1024\nhours = 720\n'
                    '[[class]]\nid = "gpu"\npath = "gpu"\nsignal = "ecc"\ncount = 30\n'
                    '[[class]]\nid = "sw"\nrate_per_gpu_hour = 1e-5\n')
    profile = load_profile(str(path))
    assert profile.name == "mine" and [c.path for c in profile.classes] == ["gpu", "none"]
    assert profile.classes[1].count == pytest.approx(1e-5 * 1024 * 720)
    assert profile.classes[0].signal == "ecc"


def test_a_csv_profile_of_events(tmp_path: Path) -> None:
    path = tmp_path / "events.csv"
    path.write_text("# gpus: 512\n# hours: 100\nat,class,path,signal\n"
                    "2026-01-01T00:00:00,gpu,gpu,xid79\n2026-01-01T05:30:00,host,host,\n"
                    "2026-01-02T00:00:00,gpu,gpu,xid79\n")
    profile = load_profile(str(path))
    assert {c.id: c.count for c in profile.classes} == {"gpu": 2, "host": 1}
    assert profile.events == ((0.0, "gpu"), (5.5, "host"), (24.0, "gpu"))


@pytest.mark.parametrize(("text", "words"), [
    ('gpus = 8\nhours = 1\n', "no \\[\\[class\\]\\] tables"),
    ('gpus = 0\nhours = 1\n[[class]]\nid = "a"\ncount = 1\n', "'gpus' = 0"),
    ('gpus = 8\nhours = 1\n[[class]]\nid = "a"\n', "give 'count' or 'rate_per_gpu_hour'"),
    ('gpus = 8\nhours = 1\n[[class]]\nid = "a"\ncount = 1\npath = "nic"\n', "'path' = 'nic'"),
    ('gpus = 8\nhours = 1\ncolour = 3\n[[class]]\nid = "a"\ncount = 1\n', "unknown key"),
    ('gpus = 8\nhours = 1\n[[class]]\nid = "a"\ncount = 1\n[[class]]\nid = "a"\ncount = 2\n',
     "given twice"),
])
def test_a_bad_profile_is_one_message_naming_the_field(tmp_path: Path, text: str,
                                                       words: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ProfileError, match=words):
        load_profile(str(path))
    with pytest.raises(ProfileError, match="neither a built-in profile"):
        load_profile("llama4")


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6),
                    # Past a float's range, and past the failures a trace may hold.
                    st.integers(10**300, 10**420), st.sampled_from([0.5, 1e12, 1e308]),
                    st.floats(allow_nan=True), st.text(max_size=8),
                    st.lists(st.integers(), max_size=2))


@settings(max_examples=200, deadline=None)
@given(top=st.dictionaries(st.sampled_from(["name", "gpus", "hours", "source", "extra"]),
                           _VALUES),
       classes=st.lists(st.dictionaries(
           st.sampled_from(["id", "count", "rate_per_gpu_hour", "path", "signal", "planned",
                            "gpus_per_host"]),
           _VALUES), max_size=3))
def test_any_toml_profile_parses_or_is_refused_with_a_profile_error(
        top: dict[str, object], classes: list[dict[str, object]]) -> None:
    try:
        profile = profile_from_toml({**top, "class": classes})
    except ProfileError:
        return
    assert profile.gpus >= 1 and profile.hours > 0 and profile.classes
    assert all(c.path in ("gpu", "host", "none") and c.count >= 0 for c in profile.classes)
    assert profile.total() <= MAX_EXPECTED_FAILURES and profile.per_host >= 1


def test_model_inputs_out_of_range_are_refused_together() -> None:
    with pytest.raises(ProfileError, match=r"--checkpoint-min -1.*--link-up-s nan"):
        ModelInputs(gpus=8, hours=1, checkpoint_min=-1, link_up_s=float("nan")).check()
    with pytest.raises(ProfileError, match="--repair-h: no class gpu-x"):
        ModelInputs(gpus=8, hours=1, repair_h={"gpu-x": 1}).repair_of(LLAMA3_405B)


_CELLS = st.one_of(st.sampled_from(["gpu", "host", "none", "xid79", "ecc", "", "1.5", "-2",
                                    "nan", "2026-01-01T00:00:00", "2026-13-01",
                                    "2026-01-01T01:00:00+00:00", "2026-01-01T02:00:00Z",
                                    "\"" + "x" * (130 * 1024) + "\""]),
                   st.text(alphabet="abc,\"0123456789.:-T ", max_size=12))


@settings(max_examples=200, deadline=None)
@given(header=st.sampled_from(["# gpus: 64\n# hours: 10\n", "# gpus: 64\n", "# gpus: x\n",
                               "", "# gpus: 0.5\n# hours: 10\n", "# gpus: 1e400\n# hours: 1\n",
                               "# gpus: 64\n# hours: 1e400\n"]),
       columns=st.sampled_from(["at,class,path,signal", "at,class,path", "at,class", "when"]),
       rows=st.lists(st.lists(_CELLS, min_size=1, max_size=4), max_size=4))
def test_any_csv_profile_parses_or_is_refused_with_a_profile_error(
        tmp_path_factory: pytest.TempPathFactory, header: str, columns: str,
        rows: list[list[str]]) -> None:
    path = tmp_path_factory.mktemp("csv") / "events.csv"
    path.write_text(header + columns + "\n" + "".join(",".join(r) + "\n" for r in rows))
    try:
        profile = load_profile(str(path))
    except ProfileError:
        return
    assert profile.events is not None and len(profile.events) == profile.total()
    assert all(0 <= h <= profile.hours for h, _ in profile.events)
    assert all(c.path in ("gpu", "host", "none") for c in profile.classes)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


#: Each profile a reviewer found crashing the parser with a traceback, and the words of
#: the one message it gets instead.
HOSTILE = {
    "half-a-gpu.csv": ("# gpus: 0.5\n# hours: 10\nat,class,path\n1,gpu,gpu\n",
                       r"'gpus' = 0.5: expected a whole number, at least 1"),
    "mixed-offsets.csv": ("# gpus: 8\n# hours: 100\nat,class,path\n"
                          "2026-01-01T00:00:00,gpu,gpu\n2026-01-01T05:00:00+00:00,gpu,gpu\n",
                          r"row 3: at = '2026-01-01T05:00:00\+00:00': a UTC offset, where "
                          r"the first time \(row 2\) has none"),
    "offset-first.csv": ("# gpus: 8\n# hours: 100\nat,class,path\n"
                         "2026-01-01T00:00:00Z,gpu,gpu\n2026-01-01T05:00:00,gpu,gpu\n",
                         r"row 3: .*no UTC offset, where the first time \(row 2\) has one"),
    "wide.csv": ("# gpus: 8\n# hours: 100\nat,class,path\n1,gpu," + "x" * (130 * 1024)
                 + "\n", r"row \d+: not CSV \(field larger than field limit"),
    "many.csv": ("# gpus: 8\n# hours: 100\nat,class,path\n"
                 + "1,gpu,gpu\n" * (MAX_EXPECTED_FAILURES + 1), r"more than the 100,000"),
    "huge-gpus.toml": ("gpus = " + "9" * 400 + "\nhours = 1\n[[class]]\nid = 'a'\ncount = 1\n",
                       r"'gpus' = 999999999999\.\.\. \(400 digits\): expected a finite"),
    "huge-count.toml": ("gpus = 8\nhours = 1\n[[class]]\nid = 'a'\ncount = 1e12\n",
                        r"class 'a': 1e\+12 failures over the profile's GPUs and hours: more "
                        r"than the 100,000 a trace may hold"),
    "huge-rate.toml": ("gpus = 10_000_000_000\nhours = 1e10\n[[class]]\nid = 'a'\n"
                       "rate_per_gpu_hour = 1e300\n", r"class 'a': inf failures"),
    "half-a-host.toml": ("gpus = 8\nhours = 1\ngpus_per_host = 0.5\n[[class]]\nid = 'a'\n"
                         "count = 1\n", r"'gpus_per_host' = 0.5: expected a whole number"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_profile_is_one_profile_error_naming_the_file(tmp_path: Path,
                                                                name: str) -> None:
    text, words = HOSTILE[name]
    path = _write(tmp_path, name, text)
    with pytest.raises(ProfileError, match=words) as raised:
        load_profile(str(path))
    assert str(raised.value).startswith(str(path)) and "\n" not in str(raised.value)


def test_an_unreadable_profile_is_a_profile_error(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(self: Path, *args: object, **kwargs: object) -> str:
        raise PermissionError(13, "Permission denied", str(self))

    # Refused by the file system (chmod does not stop the root the tests may run as).
    monkeypatch.setattr(Path, "read_text", refused)
    for name in ("locked.toml", "locked.csv"):
        path = tmp_path / name
        path.touch()
        with pytest.raises(ProfileError, match=f"{name}: cannot read it \\(Permission denied"):
            load_profile(str(path))


def test_a_job_past_the_traces_cap_is_refused_before_drawing() -> None:
    from labd.measure.ettr import check_job

    # 56 x Llama 3's size: 26,000 failures a draw, 104,000 at the rate sweep's 4x.
    big = ModelInputs(gpus=LLAMA3_405B.gpus * 56, hours=LLAMA3_405B.hours)
    assert check_expected(LLAMA3_405B, big.gpus, big.hours) == pytest.approx(466 * 56)
    with pytest.raises(ProfileError, match=r"at the rate sweep's 4x of its rates expects "
                                           r"1\.04e\+05 failures per trace: more than the "
                                           r"100,000"):
        check_job(LLAMA3_405B, big)
    with pytest.raises(ProfileError, match="failures per trace"):
        sample_trace(LLAMA3_405B, 10**12, 1e6, np.random.default_rng(0))


def _poisson_reference(mean: float, level: float) -> tuple[int, int]:
    """The central interval summed from k = 0, as the definition reads."""
    tail = (1 - level) / 2
    low, cumulative, k = None, 0.0, 0
    while True:
        cumulative += math.exp(k * math.log(mean) - mean - math.lgamma(k + 1))
        if low is None and cumulative > tail:
            low = k
        if cumulative >= 1 - tail:
            assert low is not None
            return low, k
        k += 1


@settings(max_examples=200, deadline=None)
@given(mean=st.floats(1e-6, 5e4), level=st.sampled_from([0.5, 0.9, 0.95, 0.99]))
def test_the_poisson_interval_is_the_exact_one_from_its_window(mean: float,
                                                               level: float) -> None:
    assert poisson_interval(mean, level) == _poisson_reference(mean, level)


def test_the_poisson_interval_of_a_large_mean_is_the_normal_one() -> None:
    # A mean of 2e6 summed from k = 0 took 10 s; the window sums 34,000 terms.
    low, high = poisson_interval(2e6)
    spread = 1.959964 * math.sqrt(2e6)
    assert abs(low - (2e6 - spread)) <= 1.5 and abs(high - (2e6 + spread)) <= 1.5
    # Above 1e7 the normal approximation with its skew term; the two meet there.
    for mean in (1e7, 1e7 + 1, 1e12):
        low, high = poisson_interval(mean)
        spread = 1.959964 * math.sqrt(mean)
        assert abs(low - (mean - spread)) <= 1.5 and abs(high - (mean + spread)) <= 1.5
    with pytest.raises(ProfileError, match="mean inf"):
        poisson_interval(math.inf)
    assert poisson_interval(math.nan) == (0, 0)


def test_draws_without_a_swappable_failure_are_left_out_of_the_no_spare_share() -> None:
    # One GPU failure expected in 20 draws: most draws have none to swap.
    profile = Profile("rare", "a test", 8, 10, (
        FailureClass("gpu", "GPU", 0.05, "gpu"), FailureClass("sw", "software", 5, "none")))
    inputs = ModelInputs(gpus=8, hours=10, spares=0)
    outcome = simulate(profile, inputs, STEADY, traces=200, seed=3)
    # With no spare, every failure with a path finds none: 100 %, not diluted by the draws
    # that had none (which counted 0 % before).
    assert outcome.no_spare_share is not None
    assert outcome.no_spare_share.mean == 1.0 and outcome.no_spare_share.low == 1.0
    assert 0 < outcome.no_spare_traces < 50
    with_spares = simulate(profile, replace(inputs, spares=4), STEADY, traces=200, seed=3)
    assert with_spares.no_spare_share is not None and with_spares.no_spare_share.mean == 0.0
    # No draw with a failure on a recovery path: no share at all, and the report says so.
    none = Profile("none", "a test", 8, 10, (FailureClass("sw", "software", 5, "none"),))
    outcome = simulate(none, inputs, STEADY, traces=20, seed=3)
    assert outcome.no_spare_share is None and outcome.no_spare_traces == 0


def test_the_rate_sweep_multiplies_the_modelled_rate_and_says_so() -> None:
    from labd.measure.ettr import SWEEPS

    assert SWEEPS["rate"][0] == "failure rate, x the modelled job's"
    inputs = ModelInputs(gpus=LLAMA3_405B.gpus, hours=LLAMA3_405B.hours, rate_scale=2)
    rate = sweep("rate", LLAMA3_405B, inputs, STEADY, traces=20, seed=1)
    once = simulate(LLAMA3_405B, inputs, STEADY, traces=20, seed=1)
    # The sweep's 1x is the modelled job's rate (the profile's x --rate-scale 2).
    assert dict(rate)[1].failures.mean == once.failures.mean
