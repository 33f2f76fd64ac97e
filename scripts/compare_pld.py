#!/usr/bin/env python3
"""Speed/accuracy anchor for `benches/pld.rs`: dp_accounting's PLDAccountant (pessimistic,
connect-the-dots, value_discretization_interval 1e-4, add/remove) on the same pipelines.

Usage: python3 scripts/compare_pld.py [hetero|hetero1000|dpsgd|all]
Prints: case, epsilon at delta, wall and CPU seconds (compare CPU seconds on a loaded machine). Not part of CI.
"""
import sys
import time

from importlib.metadata import version

from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

DELTA = 1e-5


def hetero_event(n=50, count=10_000, ds=0.02, dq=0.00002):
    """n distinct Poisson-subsampled Gaussian steps (sigma_j = 0.8 + ds*j, q_j = 0.001 + dq*j),
    each composed `count` times: 50 x 10^4 by default, 1,000 x 10^3 as `hetero1000`.

    Must match `hetero_steps()` in benches/pld.rs.
    """
    return dp_event.ComposedDpEvent([
        dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(0.001 + dq * j, dp_event.GaussianDpEvent(0.8 + ds * j)), count)
        for j in range(n)
    ])


def dpsgd_event():
    """RAPID DP-SGD row of fixtures/reference/dpsgd.csv: sigma 1.0, q = 64/60000, 9375 steps."""
    return dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(64 / 60000, dp_event.GaussianDpEvent(1.0)), 9375)


def run(name, ev):
    t0 = time.perf_counter()
    c0 = time.process_time()
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(ev)
    eps = acc.get_epsilon(DELTA)
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    print(f"{name}\tdp_accounting {version('dp-accounting')}\teps={eps!r}\tdelta={DELTA}\twall_s={dt:.3f}\tcpu_s={cpu:.3f}",
          flush=True)


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    if which in ("dpsgd", "all"):
        run("dpsgd", dpsgd_event())
    if which in ("hetero", "all"):
        run("hetero", hetero_event())
    if which in ("hetero1000", "all"):
        run("hetero1000", hetero_event(1000, 1_000, 0.001, 0.000001))
