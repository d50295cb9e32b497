"""benchmarks/ctedd_vs_maddpg.py: the table of Chen 2019's comparison, checked by hand."""

import pytest

from tests.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def comparison():
    return load_benchmark("ctedd_vs_maddpg")


def test_late_rise_is_the_change_over_the_last_fifth_of_the_steps(comparison):
    curve = [(0, -90.0), (40, -60.0), (80, -50.0), (100, -45.0)]
    assert comparison.late_rise(curve) == pytest.approx(5.0)  # -45 - (-50), at step <= 80
    assert comparison.late_rise([(100, -45.0)]) == 0.0  # one point: no change measured
    assert comparison.late_rise(curve, fraction=0.5) == pytest.approx(15.0)  # from step 40


def test_ordering_and_separated_intervals(comparison):
    def runs(*finals):
        return [[(0, -100.0), (100, value)] for value in finals]

    # Means -30, -50, -70, standard deviations 1, 1, 10; t(0.975, 2) = 4.303: half-widths
    # 4.303 / sqrt(3) = 2.484 and 24.84.
    curves = {"CN-V1": {"CTEDD-G": runs(-31, -30, -29), "CTEDD-L-1": runs(-51, -50, -49),
                        "MADDPG-1": runs(-80, -70, -60)}}  # fmt: skip
    entry = comparison.summarize(curves)["CN-V1"]
    g, m = entry["series"]["CTEDD-G"], entry["series"]["MADDPG-1"]
    assert g["mean"] == pytest.approx(-30.0) and g["ci95"] == pytest.approx(2.484, abs=1e-3)
    assert m["ci95"] == pytest.approx(24.84, abs=1e-2)
    assert g["late_rise"] == pytest.approx(70.0)  # from -100 at step 0
    assert g["late_rise_ci95"] == pytest.approx(2.484, abs=1e-3)
    assert entry["ordering_holds"] == {"m1": True}
    # G's lower bound -32.5 is above L's upper -47.5; L's lower -52.5 is below MADDPG's upper
    # -45.2: the means are ordered, the intervals not separated.
    assert entry["separated"] == {"m1": False}
    curves["CN-V1"]["MADDPG-1"] = runs(-71, -70, -69)
    assert comparison.summarize(curves)["CN-V1"]["separated"] == {"m1": True}
    curves["CN-V1"]["MADDPG-1"] = runs(-41, -40, -39)  # MADDPG above CTEDD-L
    assert comparison.summarize(curves)["CN-V1"]["ordering_holds"] == {"m1": False}
