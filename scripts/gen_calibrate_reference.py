#!/usr/bin/env python3
"""Reference answers of DP-SGD calibration at δ = 1e-5 (not part of CI).

Writes fixtures/reference/calibrate_dpsgd.csv: for target ε at δ, the noise multiplier σ (q and T
fixed), the Poisson rate q (σ and T fixed) and the number of steps T (σ and q fixed) that
dp_accounting's `calibrate_dp_mechanism` finds with its pessimistic PLD accountant (value
interval 1e-4, add/remove; tol 1e-6 relative to the answer for σ and q; discrete for the steps).
The cases are the calibrate rows of scripts/bench_whole_process.py.

Usage: /tmp/pyv/bin/python scripts/gen_calibrate_reference.py > fixtures/reference/calibrate_dpsgd.csv
"""
import csv
import sys
from importlib.metadata import version

from dp_accounting import dp_event as E
from dp_accounting import mechanism_calibration as M
from dp_accounting.pld import pld_privacy_accountant as P

TARGET, DELTA = 8.0, 1e-5
Q, SIGMA, STEPS = 0.004, 1.1, 10_000


def ev(q, s, t):
    return E.SelfComposedDpEvent(E.PoissonSampledDpEvent(q, E.GaussianDpEvent(s)), t)


def acc():
    return P.PLDAccountant(value_discretization_interval=1e-4)


def main():
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["solve_for", "target_epsilon", "delta", "noise_multiplier", "sample_rate", "steps", "answer",
                  "source"])
    source = f"dp-accounting=={version('dp-accounting')} PLD value_discretization_interval 1e-4"
    s = M.calibrate_dp_mechanism(acc, lambda s: ev(Q, s, STEPS), TARGET, DELTA,
                                 M.ExplicitBracketInterval(0.3, 1.0), tol=1e-7)
    out.writerow(["noise-multiplier", TARGET, DELTA, "", Q, STEPS, repr(s), source])
    sys.stdout.flush()
    q = M.calibrate_dp_mechanism(acc, lambda q: ev(q, SIGMA, STEPS), TARGET, DELTA,
                                 M.ExplicitBracketInterval(1e-3, 0.1), tol=1e-9)
    out.writerow(["sample-rate", TARGET, DELTA, SIGMA, "", STEPS, repr(q), source])
    sys.stdout.flush()
    t = M.calibrate_dp_mechanism(acc, lambda t: ev(Q, SIGMA, int(t)), TARGET, DELTA,
                                 M.ExplicitBracketInterval(100_000, 200_000), discrete=True)
    out.writerow(["steps", TARGET, DELTA, SIGMA, Q, "", t, source])


if __name__ == "__main__":
    main()
