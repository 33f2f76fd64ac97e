#!/usr/bin/env python3
"""Reference numbers for long-horizon PLD accounting (not part of CI).

Writes fixtures/reference/pld_long_horizon.csv: DP-SGD with Poisson rate q = 0.004, noise
multiplier sigma = 1.1, T in {1e6, 1e7, 1e8} steps, add/remove, delta = 1e-5:
  - prv_accountant's lower bound, estimate and upper bound (eps_error as in the column), and
  - dp_accounting's pessimistic PLD (connect-the-dots) at the value interval in the column
    (empty where it was not run: at 10^7 steps and interval 1e-3 it took more than 11 GB and
    30 minutes on the 2-core machine).

Usage: /work/pyvenv/bin/python scripts/gen_long_horizon_reference.py > fixtures/reference/pld_long_horizon.csv
       /work/pyvenv/bin/python scripts/gen_long_horizon_reference.py gauss > fixtures/reference/pld_long_horizon_gauss.csv
The second form writes, for the same settings, the exact mean and variance of the composed
remove-direction privacy loss (per-step moments by scipy quadrature, times T) and eps(1e-5) of the
Gaussian with those moments, E[(1 - e^{eps - L})_+] = 1e-5 for L ~ N(mean, var): an independent
estimate (not a bound; the true PLD is skewed to the right, so slightly larger) that PRV can be
checked against where its mesh is too coarse.
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


def prv_bounds(mechs, counts, eps_error, delta_error=1e-10):
    prv = PRVAccountant(prvs=mechs, max_self_compositions=counts, eps_error=eps_error, delta_error=delta_error)
    lo, est, up = prv.compute_epsilon(delta=DELTA, num_self_compositions=counts)
    return float(lo), float(est), float(up)


def main():
    out = csv.writer(sys.stdout, lineterminator="\n")
    source = f"dp-accounting=={version('dp-accounting')};prv-accountant=={version('prv-accountant')}"
    out.writerow(["case", "delta", "eps_error", "eps_prv_low", "eps_prv_est", "eps_prv_up",
                  "dpacc_interval", "eps_dpacc_pld", "source"])
    # dp_accounting at 10^7 steps (interval 1e-3) took > 11 GB and > 30 min here: not run. PRV's
    # mesh is eps_error / sqrt(T/2 ln(12/delta_error)): at 10^7 steps and eps_error 0.1 that is
    # ~7e7 points (> 6 GB); eps_error 1 and 5 keep it near 7e6 and 2e7 (its lower and upper
    # bounds stay rigorous, only wider).
    only = [int(a) for a in sys.argv[1:]]
    for t, dpacc_h, eps_error in [(10**6, 1e-4, 0.01), (10**7, None, 1.0), (10**8, None, 5.0)]:
        if only and t not in only:
            continue
        q, s = 0.004, 1.1
        print(f"# T = {t}", file=sys.stderr, flush=True)
        lo, est, up = prv_bounds([PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=s)], [t],
                                 eps_error, 1e-10 if t <= 10**6 else 1e-9)
        dp = ""
        if dpacc_h is not None:
            ev = dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(s)), t)
            a = pld_privacy_accountant.PLDAccountant(NR.ADD_OR_REMOVE_ONE, value_discretization_interval=dpacc_h)
            a.compose(ev)
            dp = repr(a.get_epsilon(DELTA))
        out.writerow([f"dpsgd_q0.004_s1.1_T{t}", DELTA, eps_error, repr(lo), repr(est), repr(up),
                      "" if dpacc_h is None else dpacc_h, dp, source])
        sys.stdout.flush()


def gauss():
    import numpy as np
    from scipy import integrate
    from scipy.optimize import brentq
    from scipy.stats import norm
    q, s = 0.004, 1.1
    loss = lambda x: np.log1p(q * np.expm1((2 * x - 1) / (2 * s * s)))
    dens = lambda x: (1 - q) * norm.pdf(x, 0, s) + q * norm.pdf(x, 1, s)
    m1 = integrate.quad(lambda x: loss(x) * dens(x), -15, 16, limit=400, epsabs=1e-16)[0]
    m2 = integrate.quad(lambda x: loss(x) ** 2 * dens(x), -15, 16, limit=400, epsabs=1e-18)[0]
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["case", "delta", "mean", "variance", "eps_gauss_moments", "source"])
    for t in [10**6, 10**7, 10**8]:
        mean, var = t * m1, t * (m2 - m1 * m1)
        sd = np.sqrt(var)
        g = lambda e: norm.sf((e - mean) / sd) - np.exp(e - mean + var / 2 + norm.logsf((e - mean) / sd + sd)) - DELTA
        eps = brentq(g, mean, mean + 20 * sd, xtol=1e-12)
        out.writerow([f"dpsgd_q0.004_s1.1_T{t}", DELTA, repr(mean), repr(var), repr(eps), f"scipy=={version('scipy')}"])


if __name__ == "__main__":
    t0 = time.time()
    if sys.argv[1:] == ["gauss"]:
        gauss()
        sys.exit(0)
    main()
    print(f"# {time.time() - t0:.0f} s", file=sys.stderr)
