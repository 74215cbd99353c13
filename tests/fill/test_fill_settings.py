"""The executor's settings from the environment contract: defaults, and bad values refused naming the variable, the
value and the rule."""

from __future__ import annotations

import pytest

from pipefill import env
from pipefill_fill.settings import Settings


def test_defaults_and_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.WORK_SOURCE, "files:/tmp/x")
    for name in (env.FILL_END_QUANTILE, env.FILL_SPIN_US, env.FILL_GUARD_MS, env.FILL_OVERRUN_BUDGET_US):
        monkeypatch.delenv(name, raising=False)
    s = Settings.from_env()
    assert (s.end_quantile, s.spin_s, s.guard_s, s.overrun_budget_s) == (0.25, 0.0, 0.001, 5e-5)
    monkeypatch.setenv(env.FILL_END_QUANTILE, "0.5")
    monkeypatch.setenv(env.FILL_SPIN_US, "300")
    s = Settings.from_env()
    assert (s.end_quantile, s.spin_s) == (0.5, 0.0003)


def test_the_cpu_priority_is_idle_where_the_fill_shares_its_trainers_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.WORK_SOURCE, "files:/tmp/x")
    monkeypatch.delenv(env.FILL_CPU_PRIORITY, raising=False)
    monkeypatch.delenv(env.CPU_AFFINITY, raising=False)
    assert not Settings.from_env().cpu_idle  # cores of its own (a pod's CPU request): the default policy
    monkeypatch.setenv(env.CPU_AFFINITY, "0")
    assert Settings.from_env().cpu_idle
    monkeypatch.setenv(env.FILL_CPU_PRIORITY, "normal")
    assert not Settings.from_env().cpu_idle
    monkeypatch.delenv(env.CPU_AFFINITY)
    monkeypatch.setenv(env.FILL_CPU_PRIORITY, "idle")
    assert Settings.from_env().cpu_idle


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (env.FILL_END_QUANTILE, "1.2", "PIPEFILL_FILL_END_QUANTILE=1.2: the quantile must be within 0..1"),
        (env.FILL_SPIN_US, "-5", "PIPEFILL_FILL_SPIN_US=-5: the spin window must be within 0..10000 µs"),
        (env.FILL_SPIN_US, "fast", "PIPEFILL_FILL_SPIN_US='fast' must be a number"),
        (env.FILL_CPU_PRIORITY, "low", "PIPEFILL_FILL_CPU_PRIORITY='low': expected idle"),
        (env.FILL_OVERRUN_BUDGET_US, "-1", "PIPEFILL_FILL_OVERRUN_BUDGET_US=-1: the expected overrun per step"),
    ],
)
def test_bad_values_name_the_variable_and_the_rule(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(env.WORK_SOURCE, "files:/tmp/x")
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as err:
        Settings.from_env()
    assert message in str(err.value)
