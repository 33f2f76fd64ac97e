#!/usr/bin/env python3
"""Reference ε(δ) for tiny-ε PLD cases (issue 47, item 3): dp_accounting's PLD at its default grid
1e-4 and at a fine grid, pessimistic (connect-the-dots, an upper bound) and optimistic (privacy
buckets: every loss rounded down, a lower bound), add/remove, δ = 1e-5.

Tool: dp-accounting 0.6.0 (pip install dp-accounting==0.6.0). Writes
fixtures/reference/pld_tiny_epsilon.csv. Cases:
  dpsgd      q = 1e-3, σ = 5, T = 100
  edm_*      EDM sampler (σ_max 80, ρ 7, 50 levels, σ_min 0.002, convention A, |D| 50000, β 1):
             the 49 per-step μ of /work/shared/reference/edm_perstep_sigmamin0.002.csv (column
             mu_step(C=sqrt3072), divided by √3072 for C = 1), each Poisson(p) ∘ Gaussian(1/μ).
Usage: python3 scripts/gen_tiny_epsilon_reference.py [out.csv]
"""
import csv
import logging
import math
import sys

import dp_accounting as dpa
from dp_accounting.pld import privacy_loss_distribution as pld

logging.disable(logging.WARNING)
DELTA = 1e-5
PERSTEP = "/work/shared/reference/edm_perstep_sigmamin0.002.csv"


def edm_mus(c_label):
    rows = [r for r in csv.DictReader(open(PERSTEP)) if r["convention"] == "A_t_i"]
    mus = [float(r["mu_step(C=sqrt3072)"]) for r in rows]
    return mus if c_label == "sqrt3072" else [m / math.sqrt(3072) for m in mus]


def eps(steps, grid, pessimistic):
    """steps: list of (q, sigma, count)."""
    total = None
    for q, sigma, count in steps:
        d = pld.from_gaussian_mechanism(
            sigma, sampling_prob=q, value_discretization_interval=grid,
            pessimistic_estimate=pessimistic, use_connect_dots=pessimistic)
        if count > 1:
            d = d.self_compose(count)
        total = d if total is None else total.compose(d)
    return total.get_epsilon_for_delta(DELTA)


CASES = [
    ("dpsgd_q1e-3_s5_T100", [(1e-3, 5.0, 100)], 1e-7),
    ("edm_C1_p0.5", [(0.5, 1 / m, 1) for m in edm_mus("1")], 1e-6),
    ("edm_C1_p0.01", [(0.01, 1 / m, 1) for m in edm_mus("1")], 1e-8),
    ("edm_Csqrt3072_p0.001", [(0.001, 1 / m, 1) for m in edm_mus("sqrt3072")], 1e-6),
]


def main():
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        return
    out = sys.argv[1] if len(sys.argv) > 1 else "fixtures/reference/pld_tiny_epsilon.csv"
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["case", "delta", "grid_fine", "pess_1e-4", "pess_fine", "opt_fine", "tool"])
        for name, steps, fine in CASES:
            row = [name, DELTA, fine, eps(steps, 1e-4, True), eps(steps, fine, True), eps(steps, fine, False),
                   "dp-accounting 0.6.0"]
            print(row, flush=True)
            w.writerow(row)


if __name__ == "__main__":
    main()
