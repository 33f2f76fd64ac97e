#!/usr/bin/env python3
"""Reference numbers for the PLD accountant (not part of CI).

Writes fixtures/reference/pld_dpsgd.csv: for every setting of fixtures/reference/dpsgd.csv
(Poisson rate q, noise multiplier sigma relative to the clip norm, T steps), dp_accounting's
pessimistic PLD accountant (connect-the-dots, value interval 1e-4) under
  - ADD_OR_REMOVE_ONE at delta in {1e-5, 1e-8, 1e-10, 1e-12}, and
  - REPLACE_ONE at delta = 1e-5 (pair q N(-1) + (1-q) N(0) vs q N(1) + (1-q) N(0), std sigma),
and prv_accountant's lower bound (eps_error 0.01) at the same deltas (add/remove).

Usage: python3 scripts/gen_pld_reference.py > fixtures/reference/pld_dpsgd.csv
"""
import csv
import sys
from importlib.metadata import version

from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting import NeighboringRelation as NR
from prv_accountant import PRVAccountant
from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

DELTAS = [1e-5, 1e-8, 1e-10, 1e-12]


def main():
    rows = list(csv.DictReader(open("fixtures/reference/dpsgd.csv")))
    out = csv.writer(sys.stdout, lineterminator="\n")
    source = f"dp-accounting=={version('dp-accounting')};prv-accountant=={version('prv-accountant')}"
    hdr = ["q", "noise_multiplier", "steps_T"]
    hdr += [f"eps_dpacc_pld_add_remove_delta_{d:g}" for d in DELTAS]
    hdr += ["eps_dpacc_pld_replace_one_delta_1e-05"]
    hdr += [f"eps_prv_low_delta_{d:g}" for d in DELTAS]
    hdr += ["source"]
    out.writerow(hdr)
    for r in rows:
        q, s, t = float(r["q"]), float(r["noise_multiplier"]), int(r["steps_T"])
        ev = dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(s)), t)
        a = pld_privacy_accountant.PLDAccountant(NR.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4)
        a.compose(ev)
        ar = [a.get_epsilon(d) for d in DELTAS]
        b = pld_privacy_accountant.PLDAccountant(NR.REPLACE_ONE, value_discretization_interval=1e-4)
        b.compose(ev)
        ro = b.get_epsilon(1e-5)
        prv = PRVAccountant(
            prvs=PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=s),
            max_self_compositions=t, eps_error=0.01, delta_error=1e-14)
        lows = [prv.compute_epsilon(delta=d, num_self_compositions=t)[0] for d in DELTAS]
        out.writerow([repr(q), repr(s), t] + [repr(x) for x in ar] + [repr(ro)] + [repr(float(x)) for x in lows] + [source])
        sys.stdout.flush()


if __name__ == "__main__":
    main()
