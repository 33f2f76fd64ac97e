#!/usr/bin/env python3
"""Reference truth for fixtures/claims/dp-sgd-near-truth.toml (not run by CI).

For Poisson-subsampled Gaussian DP-SGD settings at T in {100, 1000, 10^4} steps and delta 1e-5,
computes with dp_accounting 0.6.0 (add/remove, the PLD of both directions, worse one):
  - the pessimistic connect-the-dots PLD at grid 1e-4 and 1e-5 (upper bounds on the truth);
  - the optimistic privacy-buckets PLD at grid 1e-5 (a lower estimate: every loss rounded down).
The fixture's "truth" is the pessimistic value at 1e-5; its claims sit 0.5 % either side of it
(claim_low = 0.995 * truth, claim_high = 1.005 * truth).

Usage: python3 scripts/gen_near_truth_claims.py > fixtures/reference/pld_near_truth.csv
"""
import importlib.metadata
import sys

from dp_accounting.pld import privacy_loss_distribution as pld

SETTINGS = [(0.01, 1.0), (0.004, 1.1), (0.02, 0.8)]
STEPS = [100, 1000, 10000]
DELTA = 1e-5


def eps(q, sigma, steps, h, pessimistic):
    p = pld.from_gaussian_mechanism(
        sigma,
        sampling_prob=q,
        value_discretization_interval=h,
        pessimistic_estimate=pessimistic,
        use_connect_dots=pessimistic,
    )
    return p.self_compose(steps).get_epsilon_for_delta(DELTA)


TOOL = "dp-accounting " + importlib.metadata.version("dp-accounting")
print("tool,q,noise_multiplier,steps,delta,pess_1e-4,pess_1e-5,opt_1e-5")
for q, s in SETTINGS:
    for t in STEPS:
        row = [eps(q, s, t, 1e-4, True), eps(q, s, t, 1e-5, True), eps(q, s, t, 1e-5, False)]
        print(f"{TOOL},{q},{s},{t},{DELTA}," + ",".join(f"{v:.10f}" for v in row))
        sys.stdout.flush()
