"""The bench's pure helpers (bench/stats.py, bench/scale.py): the lags read from persisted times,
the wake-up times spread over a window, and when the API phase's clients send."""
import statistics
from datetime import UTC, datetime, timedelta

from bench.scale import due_times, wake_times
from bench.stats import lags_ms, scale_rows

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


def test_even_arrivals_interleave_the_clients_at_the_rate():
    sent = sorted(t for i in range(4) for t in due_times(10.0, index=i, clients=4, count=5,
                                                          rate=20, poisson=False))
    assert sent[0] == 10.0 and len(sent) == 20
    assert {round(b - a, 9) for a, b in zip(sent, sent[1:], strict=False)} == {0.05}


def test_poisson_arrivals_keep_the_rate_with_gaps_as_random_as_an_exponential_s():
    sent = sorted(t for i in range(8) for t in due_times(0.0, index=i, clients=8, count=1_000,
                                                          rate=50, poisson=True))
    gaps = [b - a for a, b in zip(sent, sent[1:], strict=False)]
    assert 45 < len(sent) / sent[-1] < 55  # requests per second, all clients together
    # An exponential's standard deviation equals its mean; even spacing's is 0.
    assert 0.9 < statistics.pstdev(gaps) / statistics.mean(gaps) < 1.1
    assert due_times(0.0, index=3, clients=8, count=5, rate=50, poisson=True) == due_times(
        0.0, index=3, clients=8, count=5, rate=50, poisson=True)  # the same each run


def test_the_web_processs_memory_is_reported_with_the_posts_it_served():
    phase = {"clients": 16, "requests": 400, "latency_ms": {}, "offered_per_s": None,
             "requests_per_s": 40.0, "statuses": {"202": 400}, "drained_s": 0.2}
    result = {"api_load": phase, "api_executing": phase, "api_poisson": {**phase, "requests": 200},
              "api_web_rss_mb": {"processes": 1, "total_mb": 150.2, "max_mb": 150.2}}
    lines: list[str] = []

    scale_rows("postgres", result, lambda *row: None, lines)

    assert "API web process peak RSS  150 MB (largest of 1) after 1000 POSTs" in lines[-1]
