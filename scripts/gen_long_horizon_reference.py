#!/usr/bin/env python3
"""Reference numbers for long-horizon PLD accounting (not part of CI).

Writes fixtures/reference/pld_long_horizon.csv: DP-SGD with Poisson rate q = 0.004, noise
multiplier sigma = 1.1, T in {1e6, 1e7, 1e8} steps, and the heterogeneous 1,000-step event
(sigma_j = 0.8 + 0.001 j, q_j = 0.001 + 1e-6 j, each 1,000 times; benches/pld.rs), add/remove,
delta = 1e-5:
  - prv_accountant's lower bound, estimate and upper bound (eps_error as in the column), and
  - dp_accounting's pessimistic PLD (connect-the-dots) at the value interval in the column
    (empty where it was not run: at 10^7 steps and interval 1e-3 it took more than 11 GB and
    30 minutes on the 2-core machine).

Usage: /work/pyvenv/bin/python scripts/gen_long_horizon_reference.py > fixtures/reference/pld_long_horizon.csv
"""
import csv
import sys
import time
from importlib.metadata import version

from dp_accounting import dp_event
from dp_accounting import NeighboringRelation as NR
from dp_accounting.pld import pld_privacy_accountant
from prv_accountant import PRVAccountant
from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

DELTA = 1e-5


def prv_bounds(mechs, counts, eps_error):
    prv = PRVAccountant(prvs=mechs, max_self_compositions=counts, eps_error=eps_error, delta_error=1e-10)
    lo, est, up = prv.compute_epsilon(delta=DELTA, num_self_compositions=counts)
    return float(lo), float(est), float(up)


def main():
    out = csv.writer(sys.stdout, lineterminator="\n")
    source = f"dp-accounting=={version('dp-accounting')};prv-accountant=={version('prv-accountant')}"
    out.writerow(["case", "delta", "eps_error", "eps_prv_low", "eps_prv_est", "eps_prv_up",
                  "dpacc_interval", "eps_dpacc_pld", "source"])
    # dp_accounting at 10^7 steps (interval 1e-3) took > 11 GB and > 30 min here: not run.
    for t, dpacc_h, eps_error in [(10**6, 1e-4, 0.01), (10**7, None, 0.1), (10**8, None, 0.5)]:
        q, s = 0.004, 1.1
        print(f"# T = {t}", file=sys.stderr, flush=True)
        lo, est, up = prv_bounds([PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=s)], [t], eps_error)
        dp = ""
        if dpacc_h is not None:
            ev = dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(s)), t)
            a = pld_privacy_accountant.PLDAccountant(NR.ADD_OR_REMOVE_ONE, value_discretization_interval=dpacc_h)
            a.compose(ev)
            dp = repr(a.get_epsilon(DELTA))
        out.writerow([f"dpsgd_q0.004_s1.1_T{t}", DELTA, eps_error, repr(lo), repr(est), repr(up),
                      "" if dpacc_h is None else dpacc_h, dp, source])
        sys.stdout.flush()
    mechs = [PoissonSubsampledGaussianMechanism(sampling_probability=0.001 + 1e-6 * j, noise_multiplier=0.8 + 0.001 * j)
             for j in range(1000)]
    lo, est, up = prv_bounds(mechs, [1000] * 1000, 0.01)
    # dp_accounting on this event: 6.647861373 at interval 1e-4 (docs/pld.md, 166 s; not rerun here).
    out.writerow(["hetero_1000x1e3", DELTA, 0.01, repr(lo), repr(est), repr(up), 1e-4, repr(6.647861373), source])


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"# {time.time() - t0:.0f} s", file=sys.stderr)
