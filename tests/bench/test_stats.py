"""The bench's pure helpers for the sleeping runs' phase (bench/stats.py, bench/scale.py): the
lags read from persisted times, and the wake-up times spread over a window."""
from datetime import UTC, datetime, timedelta

from bench.scale import wake_times
from bench.stats import lags_ms

T = datetime(2026, 12, 6, 18, 0, tzinfo=UTC)


def test_a_lag_is_the_later_time_minus_the_earlier_in_milliseconds():
    pairs = [(T, T + timedelta(seconds=1.5)), (T, T + timedelta(microseconds=250)), (T, T)]
    assert lags_ms(pairs) == [1500.0, 0.25, 0.0]


def test_a_lag_woken_early_is_negative_not_dropped():
    assert lags_ms([(T, T - timedelta(milliseconds=3))]) == [-3.0]


def test_a_pair_missing_either_time_is_left_out():
    assert lags_ms([(T, None), (None, T), (T, T + timedelta(seconds=2))]) == [2000.0]


def test_wake_times_are_spread_evenly_over_the_window_from_its_start():
    assert wake_times(100.0, window_s=10, runs=4) == [100.0, 102.5, 105.0, 107.5]
    times = wake_times(0.0, window_s=200, runs=10_000)
    assert len(times) == 10_000 and times[0] == 0.0 and times[-1] < 200
    assert {round(b - a, 9) for a, b in zip(times, times[1:], strict=False)} == {0.02}
