#!/usr/bin/env python3
"""Reference noise multipliers for calibration at small δ (not part of CI).

Writes fixtures/reference/pld_calibration.csv: for DP-SGD settings of fixtures/reference/dpsgd.csv
(Poisson rate q, T steps) and a target (ε, δ) with δ down to 1e-12,
  - sigma_dpacc_pld: dp_accounting's `calibrate_dp_mechanism` with its pessimistic PLD accountant
    (value interval 1e-4, add/remove), tol 1e-5: the smallest noise multiplier it accepts;
  - sigma_prv_low: the noise multiplier at which prv_accountant's *lower* bound of ε equals the
    target (bisection, eps_error 0.01, delta_error δ/1000): below it no sound accountant may
    certify the target.

Usage: python3 scripts/gen_calibration_reference.py > fixtures/reference/pld_calibration.csv
"""
import csv
import sys
from importlib.metadata import version

from dp_accounting import dp_event, mechanism_calibration
from dp_accounting.pld import pld_privacy_accountant
from prv_accountant import PRVAccountant
from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

CASES = [  # (q, T, target epsilon, delta)
    (64 / 60000, 9375, 2.0, 1e-10),
    (64 / 60000, 9375, 3.0, 1e-12),
    (64 / 60000, 46875, 2.0, 1e-10),
    (64 / 60000, 46875, 4.0, 1e-12),
    (0.00128, 7812, 1.0, 1e-10),
    (0.00128, 39062, 3.0, 1e-12),
]


def event(q, t, s):
    return dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(s)), t)


def prv_low(q, t, s, delta):
    acc = PRVAccountant(prvs=PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=s),
                        max_self_compositions=t, eps_error=0.01, delta_error=delta / 1000)
    return acc.compute_epsilon(delta=delta, num_self_compositions=t)[0]


def main():
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["q", "steps_T", "target_epsilon", "delta", "sigma_dpacc_pld", "sigma_prv_low", "source"])
    source = f"dp-accounting=={version('dp-accounting')};prv-accountant=={version('prv-accountant')}"
    for q, t, eps, delta in CASES:
        s_dp = mechanism_calibration.calibrate_dp_mechanism(
            lambda: pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4),
            lambda s: event(q, t, s), eps, delta,
            mechanism_calibration.ExplicitBracketInterval(0.3, 10.0), tol=1e-5)
        lo, hi = 0.3, s_dp * 1.1
        while hi - lo > 1e-5:
            mid = (lo + hi) / 2
            if prv_low(q, t, mid, delta) > eps:
                lo = mid
            else:
                hi = mid
        out.writerow([repr(q), t, repr(eps), repr(delta), repr(s_dp), repr(lo), source])
        sys.stdout.flush()


if __name__ == "__main__":
    main()
