#!/usr/bin/env python3
"""In-process speed of the Python package against dp_accounting (outside CI).

The two heterogeneous PLD cases of benches/pld.rs (must match `hetero_steps()` there and
scripts/compare_pld.py): 50 distinct Poisson-subsampled Gaussian steps (σ_j = 0.8 + 0.02 j,
q_j = 0.001 + 2e-5 j) × 10⁴ each, and 1,000 distinct steps (σ_j = 0.8 + 0.001 j,
q_j = 0.001 + 1e-6 j) × 10³ each; ε at δ = 1e-5, add/remove.

Both run in this one Python process on the same dp_accounting event object:
  - dpaudit:       dpaudit.account(DpEvent.from_dp_accounting(event), delta, accountants="pld")
                   (conversion included; median of --repeat runs);
  - dp_accounting: PLDAccountant(value_discretization_interval=1e-4).compose(event)
                   .get_epsilon(delta) (one run: 1e-4 is the coarsest grid whose ε is within
                   0.1 % of dpaudit's for both cases, docs/pld.md "Speed": the ratio is at equal ε).
The script checks that the two ε agree within 0.1 % and that dpaudit's is not below
dp_accounting's by more than that, and prints the ratio.

Usage: python scripts/bench_python.py [--quick] [--repeat N]
  (needs `pip install .` and dp-accounting in the same environment; --quick: only 50 × 10⁴)
"""

import argparse
import statistics
import time

from dp_accounting import dp_event as dpe
from dp_accounting.pld import pld_privacy_accountant

import dpaudit

DELTA = 1e-5


def hetero_event(n, count, ds, dq):
    return dpe.ComposedDpEvent(
        events=[
            dpe.SelfComposedDpEvent(
                event=dpe.PoissonSampledDpEvent(
                    sampling_probability=0.001 + dq * j,
                    event=dpe.GaussianDpEvent(noise_multiplier=0.8 + ds * j),
                ),
                count=count,
            )
            for j in range(n)
        ]
    )


def ours(event, repeat):
    times, eps = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        r = dpaudit.account(dpaudit.DpEvent.from_dp_accounting(event), delta=DELTA, accountants="pld")
        times.append(time.perf_counter() - t)
        assert r["pld"].kind == "upper_bound"
        eps = r.epsilon
    return eps, statistics.median(times)


def theirs(event):
    t = time.perf_counter()
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(event)
    eps = acc.get_epsilon(DELTA)
    return eps, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the 50 × 10⁴ case")
    ap.add_argument("--repeat", type=int, default=5, help="dpaudit runs per case (median)")
    a = ap.parse_args()
    cases = [("50 × 10⁴", hetero_event(50, 10_000, 0.02, 0.00002))]
    if not a.quick:
        cases.append(("1,000 × 10³", hetero_event(1000, 1_000, 0.001, 0.000001)))
    print("| case | dp_accounting ε (grid 1e-4) | dpaudit ε | dp_accounting s | dpaudit s | ratio |")
    print("|---|---|---|---|---|---|")
    for name, ev in cases:
        e_ours, t_ours = ours(ev, a.repeat)
        e_theirs, t_theirs = theirs(ev)
        rel = (e_ours - e_theirs) / e_theirs
        assert abs(rel) <= 1e-3, f"{name}: ε differ by {rel:+.3%}: not an equal-ε comparison"
        print(f"| {name} | {e_theirs:.9f} | {e_ours:.6f} ({rel:+.3%}) | {t_theirs:.2f} | {t_ours:.3f} | ≈ {t_theirs / t_ours:.0f}× |", flush=True)


if __name__ == "__main__":
    main()
