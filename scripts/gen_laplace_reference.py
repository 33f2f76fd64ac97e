#!/usr/bin/env python3
"""Reference for the exact Laplace PLD (fixtures/reference/pld_laplace.csv; not run by CI).

dp_accounting's Laplace PLD (LaplacePrivacyLoss, pessimistic connect-the-dots, add/remove, both
directions, the worse one) for full-batch and Poisson-subsampled Laplace mechanisms with
sensitivity 1 and scale b, composed T times, at grids 1e-4 and 1e-5; epsilon at delta.

Usage: python3 scripts/gen_laplace_reference.py > fixtures/reference/pld_laplace.csv
"""
import importlib.metadata
import sys

from dp_accounting.pld import privacy_loss_distribution as pld

TOOL = "dp-accounting " + importlib.metadata.version("dp-accounting")
CASES = [  # (b, q, T, delta)
    (1.0, 1.0, 10, 1e-5),
    (2.0, 1.0, 100, 1e-5),
    (0.5, 0.01, 1000, 1e-5),
    (1.0, 0.05, 1000, 1e-6),
    (0.1, 0.01, 100, 1e-5),
]
print("tool,b,q,steps,delta,eps_1e-4,eps_1e-5")
for b, q, t, d in CASES:
    vals = []
    for h in (1e-4, 1e-5):
        p = pld.from_laplace_mechanism(b, sensitivity=1, sampling_prob=q, value_discretization_interval=h)
        vals.append(p.self_compose(t).get_epsilon_for_delta(d))
    print(f"{TOOL},{b},{q},{t},{d}," + ",".join(f"{v:.10f}" for v in vals))
    sys.stdout.flush()
