"""Energy meters: NVML (whole GPU and attributed), RAPL with wrap-around, the CPU model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from greenctl.data.errors import HardwareError
from greenctl.profiler.energy import (
    IDLE_W_PER_CORE,
    TDP_W_PER_CORE,
    ModeledCpuMeter,
    NvmlCounter,
    NvmlEnergyMeter,
    RaplMeter,
    attributed_energy_j,
    cpu_meter,
)
from greenctl.profiler.fake_nvml import FakeNvml

FAKE = Path(__file__).with_name("fake_a100.json")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_nvml_whole_gpu_energy_per_request():
    clock = Clock()
    fake = FakeNvml(json.loads(FAKE.read_text()), clock=clock)
    fake.set_power(1, 50.0)  # idle reading before the run
    meter = NvmlEnergyMeter(fake, 1, clock=clock)
    meter.start()
    fake.set_power(1, 300.0)
    clock.t += 4.0
    r = meter.stop(requests=200)
    assert r.method == "nvml"
    assert r.energy_j == pytest.approx(1200.0)
    assert r.power_w == pytest.approx(300.0)
    assert r.idle_power_w == pytest.approx(50.0)
    assert r.energy_j_per_request == pytest.approx(6.0)


def test_mig_instance_is_charged_its_share_of_compute_slices():
    clock = Clock()
    fake = FakeNvml(json.loads(FAKE.read_text()), clock=clock)
    three = next(m for m in fake.mig_instances(0) if m.profile == "3g.20gb")
    share = three.slices / fake.total_compute_slices(0)
    meter = NvmlEnergyMeter(fake, three.gpu_index, share=share, clock=clock)
    meter.start()
    clock.t += 7.0
    r = meter.stop(requests=30)
    whole = 280.0 * 7.0
    assert r.method == "nvml-attributed"
    assert r.energy_j == pytest.approx(whole * 3 / 7)
    assert r.power_w == pytest.approx(280.0 * 3 / 7)
    assert r.idle_power_w == pytest.approx(280.0 * 3 / 7)
    assert r.energy_j_per_request == pytest.approx(whole * 3 / 7 / 30)


def test_a_share_measured_alone_is_charged_all_the_power_above_idle():
    """A 1g slice (1/7) profiled alone: the GPU idles at 120 W and draws 190 W while it runs.
    The 70 W above idle are the slice's; only the idle power is split by compute share
    (measured on an H200: 7 emulated 1g slices of EfficientNet-B7 together drew 75.3 W each,
    1/7 of the whole counter gave 26.9 W, this rule 85.6 W)."""
    clock = Clock()
    fake = FakeNvml(json.loads(FAKE.read_text()), clock=clock)
    fake.set_power(1, 120.0)
    meter = NvmlEnergyMeter(fake, 1, share=1 / 7, clock=clock)
    meter.sample_idle()
    meter.start()
    fake.set_power(1, 190.0)
    clock.t += 5.0
    r = meter.stop(requests=100)
    assert r.method == "nvml-attributed"
    assert r.power_w == pytest.approx(120.0 / 7 + 70.0)
    assert r.energy_j == pytest.approx((120.0 / 7 + 70.0) * 5.0)
    assert r.idle_power_w == pytest.approx(120.0 / 7)
    assert r.energy_j_per_request == pytest.approx((120.0 / 7 + 70.0) * 5.0 / 100)
    # seven such slices running at once add up to the whole GPU: idle once, each its own 70 W
    assert 7 * r.power_w == pytest.approx(120.0 + 7 * 70.0)


def test_attribution_rule_edges():
    # whole device: the counter as read
    assert attributed_energy_j(500.0, 50.0, 2.0, 1.0) == 500.0
    # no idle reading: the share of the whole counter, as before the rule
    assert attributed_energy_j(700.0, None, 2.0, 0.25) == pytest.approx(175.0)
    assert attributed_energy_j(700.0, float("nan"), 2.0, 0.25) == pytest.approx(175.0)
    # a window below the idle reading: the share of what was drawn, nothing above idle
    assert attributed_energy_j(180.0, 100.0, 2.0, 0.25) == pytest.approx(45.0)
    # continuous at idle
    assert attributed_energy_j(200.0, 100.0, 2.0, 0.25) == pytest.approx(50.0)
    assert attributed_energy_j(200.0 + 1e-9, 100.0, 2.0, 0.25) == pytest.approx(50.0)


def test_live_counters_of_served_instances_keep_the_share_of_the_whole():
    """Served instances of one GPU run at once: each live counter is its share of the whole,
    so the instances' counters sum to the GPU's energy (no dynamic power counted twice)."""
    clock = Clock()
    fake = FakeNvml(json.loads(FAKE.read_text()), clock=clock)
    fake.set_power(1, 120.0)
    counters = [NvmlCounter(fake, 1, share=s, clock=clock) for s in (3 / 7, 4 / 7)]
    fake.set_power(1, 400.0)
    clock.t += 2.0
    assert sum(c.joules() for c in counters) == pytest.approx(800.0)


def test_nvml_meter_needs_the_counter_but_not_the_power_reading():
    clock = Clock()
    fake = FakeNvml(json.loads(FAKE.read_text()), clock=clock)
    fake.fail("power", "not_supported")
    meter = NvmlEnergyMeter(fake, 0, clock=clock)
    meter.start()
    clock.t += 1.0
    assert meter.stop(requests=1).idle_power_w is None
    fake.fail("energy", "gpu_is_lost")
    with pytest.raises(HardwareError, match="fallen off the bus"):
        NvmlEnergyMeter(fake, 0, clock=clock).start()
    with pytest.raises(ValueError):
        NvmlEnergyMeter(fake, 0, share=0.0)


def test_nvml_without_energy_counter_integrates_sampled_power():
    import time

    fake = FakeNvml(json.loads(FAKE.read_text()))
    fake.fail("energy", "not_supported")  # e.g. a pre-Volta GPU
    fake.set_power(1, 200.0)
    meter = NvmlEnergyMeter(fake, 1, share=0.5, sample_s=0.005)
    meter.sample_idle()
    meter.start()
    time.sleep(0.05)
    r = meter.stop(requests=10)
    assert r.method == "nvml-attributed"
    assert r.power_w == pytest.approx(100.0)
    assert r.energy_j == pytest.approx(100.0 * r.duration_s)
    assert r.idle_power_w == pytest.approx(100.0)


class _Cooling:
    """A GPU whose power reading follows a script, one value per read (the last repeats)."""

    def __init__(self, watts: list[float], fail: bool = False) -> None:
        self.watts = list(watts)
        self.reads = 0
        self.fail = fail

    def power_w(self, gpu_index: int) -> float:
        if self.fail:
            raise HardwareError("power readings not supported")
        self.reads += 1
        return self.watts.pop(0) if len(self.watts) > 1 else self.watts[0]

    def energy_mj(self, gpu_index: int) -> int:
        return 0


def test_settled_idle_power_waits_out_the_cooling_tail():
    """H100 readings 0.25 s apart after a run: 255 W falling to 123 W. One reading at once
    would have kept the 255 W tail as the idle power."""
    clock = Clock()
    gpu = _Cooling([254.8, 201.4, 168.7, 124.9, 123.2, 123.1, 123.1, 123.0, 122.9, 122.9])
    meter = NvmlEnergyMeter(gpu, 0, share=0.5, clock=clock)  # type: ignore[arg-type]

    def sleep(s: float) -> None:
        clock.t += s

    assert meter.settle_idle(sleep=sleep, interval_s=0.25) == pytest.approx(123.1)
    assert gpu.reads == 8  # stopped once five readings agreed, not at max_s
    meter.start()  # keeps the settled figure rather than reading again
    clock.t += 1.0
    assert meter.stop(requests=1).idle_power_w == pytest.approx(123.1 * 0.5)


def test_idle_power_that_never_settles_stops_at_max_s():
    clock = Clock()
    gpu = _Cooling([100.0, 200.0] * 100)

    def sleep(s: float) -> None:
        clock.t += s

    meter = NvmlEnergyMeter(gpu, 0, clock=clock)  # type: ignore[arg-type]
    assert meter.settle_idle(sleep=sleep, max_s=2.0, interval_s=0.1) == pytest.approx(100.0)
    assert gpu.reads == 21
    silent = NvmlEnergyMeter(_Cooling([1.0], fail=True), 0, clock=clock)  # type: ignore[arg-type]
    assert silent.settle_idle(sleep=sleep) is None


def _rapl(tmp_path: Path, value: int, max_range: int) -> Path:
    d = tmp_path / "intel-rapl:0"
    d.mkdir(exist_ok=True)
    (d / "energy_uj").write_text(f"{value}\n")
    (d / "max_energy_range_uj").write_text(f"{max_range}\n")
    return d / "energy_uj"


def test_rapl_energy_with_counter_wrap_and_core_share(tmp_path):
    clock = Clock()
    f = _rapl(tmp_path, 999_000_000, 999_999_999)
    meter = RaplMeter([str(f)], share=0.5, idle_window_s=0, clock=clock)
    meter.start()
    f.write_text("4_000_000".replace("_", ""))  # wrapped: 999_999_999 - 999_000_000 + 1 + 4e6
    clock.t += 2.0
    r = meter.stop(requests=10)
    expected_j = (999_999_999 - 999_000_000 + 1 + 4_000_000) / 1e6 * 0.5
    assert r.method == "rapl"
    assert r.energy_j == pytest.approx(expected_j)
    assert r.power_w == pytest.approx(expected_j / 2.0)
    assert r.energy_j_per_request == pytest.approx(expected_j / 10)


def test_rapl_idle_window_measures_idle_power(tmp_path):
    clock = Clock()
    f = _rapl(tmp_path, 1_000_000, 2**32)

    def sleep(s: float) -> None:
        f.write_text(str(int(f.read_text()) + 20_000_000))  # 20 J while "idle"
        clock.t += s

    meter = RaplMeter([str(f)], idle_window_s=0.5, clock=clock, sleep=sleep)
    meter.start()
    clock.t += 1.0
    r = meter.stop(requests=1)
    assert r.idle_power_w == pytest.approx(40.0)
    assert r.energy_j == pytest.approx(0.0)


def test_modeled_cpu_meter_follows_the_documented_formula():
    clock, cpu = Clock(), [0.0]
    meter = ModeledCpuMeter(2, clock=clock, cpu_clock=lambda: cpu[0])
    meter.start()
    clock.t += 10.0
    cpu[0] += 15.0  # 15 CPU-seconds in 10 s on 2 cores: 75 % busy
    r = meter.stop(requests=100)
    power = 2 * (IDLE_W_PER_CORE + (TDP_W_PER_CORE - IDLE_W_PER_CORE) * 0.75)
    assert r.method == "modeled"
    assert r.power_w == pytest.approx(power)
    assert r.idle_power_w == pytest.approx(2 * IDLE_W_PER_CORE)
    assert r.energy_j_per_request == pytest.approx(power * 10 / 100)
    assert meter.power_at(5.0) == pytest.approx(2 * TDP_W_PER_CORE)  # clamped


def test_modeled_defaults_can_be_overridden(monkeypatch):
    monkeypatch.setenv("GREENCTL_CPU_TDP_W_PER_CORE", "20")
    monkeypatch.setenv("GREENCTL_CPU_IDLE_W_PER_CORE", "5")
    assert ModeledCpuMeter(1).power_at(1.0) == 20.0
    assert ModeledCpuMeter(1).power_at(0.0) == 5.0


def test_cpu_meter_picks_rapl_only_when_readable(tmp_path):
    assert cpu_meter(1, total_cores=2, rapl=[]).method == "modeled"
    f = _rapl(tmp_path, 5, 2**32)
    m = cpu_meter(1, total_cores=4, rapl=[str(f)])
    assert m.method == "rapl" and isinstance(m, RaplMeter) and m.share == 0.25


def test_rapl_cores_measured_alone_are_charged_all_the_power_above_idle(tmp_path):
    """Two of eight cores profiled alone: the packages idle at 40 W and draw 100 W while they
    run; the 60 W above idle are theirs, a quarter of the idle power too."""
    clock = Clock()
    f = _rapl(tmp_path, 1_000_000, 2**32)

    def sleep(s: float) -> None:
        f.write_text(str(int(f.read_text()) + int(40e6 * s)))  # 40 W while idle
        clock.t += s

    meter = RaplMeter([str(f)], share=0.25, idle_window_s=0.5, clock=clock, sleep=sleep)
    meter.start()
    f.write_text(str(int(f.read_text()) + 200_000_000))  # 200 J in 2 s: 100 W
    clock.t += 2.0
    r = meter.stop(requests=4)
    assert r.idle_power_w == pytest.approx(10.0)
    assert r.power_w == pytest.approx(10.0 + 60.0)
    assert r.energy_j == pytest.approx(140.0)
