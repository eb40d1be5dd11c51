"""95% confidence intervals for evaluation summaries: Wilson's score interval for a proportion,
Student's t interval for a mean.

A few lines each, written here rather than taken from SciPy or statsmodels: the two formulas
are textbook and checked against published values in the tests, and neither library (with
NumPy under it) is worth a dependency of the server for them. Wilson rather than the normal
("Wald") interval because an evaluation's tiers are small and its proportions sit near 0 or 1,
where Wald gives zero-width or out-of-range intervals (Newcombe 1998; Brown, Cai & DasGupta
2001). Student's t rather than a bootstrap because it is deterministic and exact for the
mean's sampling error at any n; the mean of a skewed measure (latency, cost) over few cases is
rough either way, and it says so by its width.
"""
import math
from collections.abc import Sequence

#: The standard normal quantile at 0.975: two-sided 95%.
Z_95 = 1.959963984540054
#: Student's t at 0.975 for 1 to 30 degrees of freedom; beyond, a Cornish-Fisher expansion of
#: the normal quantile (within 1e-7 of the exact value from 31 on).
T_95 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157,
        2.228139, 2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922,
        2.093024, 2.085963, 2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831,
        2.048407, 2.045230, 2.042272)


def wilson(successes: int, n: int, z: float = Z_95) -> tuple[float, float] | None:
    """Wilson's score interval (low, high) for `successes` out of `n`; None when n is 0.
    Raises ValueError when successes is not within 0..n."""
    if n == 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes out of {n}")
    p = successes / n
    z2 = z * z
    denominator = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denominator
    # 0/n and n/n end at 0 and 1 exactly (the formula gets there up to rounding).
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


def t_quantile_95(df: int) -> float:
    """Student's t quantile at 0.975 for `df` (at least 1) degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, not {df}")
    if df <= len(T_95):
        return T_95[df - 1]
    z, n = Z_95, float(df)
    return (z + (z ** 3 + z) / (4 * n) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * n ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * n ** 3)
            + (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / (92160 * n ** 4))


def mean_interval(values: Sequence[float]) -> tuple[float, tuple[float, float] | None] | None:
    """(mean, (low, high)) with Student's t 95% interval; the interval is None for one value
    (no spread to measure), and the whole is None for none."""
    n = len(values)
    if n == 0:
        return None
    mean = math.fsum(values) / n
    if n == 1:
        return mean, None
    variance = math.fsum((value - mean) ** 2 for value in values) / (n - 1)
    half = t_quantile_95(n - 1) * math.sqrt(variance / n)
    return mean, (mean - half, mean + half)
