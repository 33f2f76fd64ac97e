#!/usr/bin/env python3
"""Runs the same DP-SGD cases through dp_accounting's RdpAccountant and through dpaudit's RDP
accountant and prints ε side by side with the time ratio.

Usage (from the repository root; not part of CI):
    python3 scripts/compare_rdp.py

dpaudit is run through the `rdp` bench binary in its probe mode (`cargo bench --bench rdp` with
RDP_COMPARE_CASES set: release build, prints JSON per case instead of running criterion).

dpaudit's timing is measured inside the Rust process (median of many runs, after warm-up), so
process start-up is excluded on both sides; dp_accounting's is the median over repeated
`RdpAccountant().compose(event); get_epsilon_and_optimal_order(δ)` calls.
"""
import json
import os
import statistics
import subprocess
import sys
import time

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant as rdp

CASES = [
    # (noise multiplier, q, steps, delta)
    (1.0, 0.001, 1_000_000, 1e-5),
    (0.8, 64 / 60000, 9375, 1e-5),
    (2.0, 0.01, 100_000, 1e-6),
    (5.0, 0.00128, 39062, 1e-5),
    (1.1, 0.004, 1_000_000, 1e-8),
    # the RDP case of scripts/bench_whole_process.py (compute alone here)
    (1.1, 0.004, 1_000_000, 1e-5),
]


def dpacc(sigma, q, steps, delta, reps=15):
    ev = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )
    times, out = [], None
    for _ in range(reps):
        t = time.perf_counter()
        a = rdp.RdpAccountant()
        a.compose(ev)
        out = a.get_epsilon_and_optimal_order(delta)
        times.append(time.perf_counter() - t)
    return float(out[0]), float(out[1]), statistics.median(times)


def main():
    env = dict(os.environ, RDP_COMPARE_CASES=json.dumps(CASES))
    res = subprocess.run(
        ["cargo", "bench", "-q", "--bench", "rdp"], check=True, capture_output=True, text=True, env=env
    ).stdout
    ours = [json.loads(line) for line in res.splitlines() if line.startswith("{")]
    print(f"dp_accounting {getattr(dp_accounting, '__version__', '0.6.0')}")
    hdr = f"{'sigma':>6} {'q':>10} {'steps':>9} {'delta':>7} | {'eps dp_acc':>11} {'ord':>6} | {'eps dpaudit':>11} {'ord':>8} {'eps compat':>11} | {'t dp_acc':>9} {'t dpaudit':>9} {'ratio':>7}"
    print(hdr)
    print("-" * len(hdr))
    for (s, q, t, d), o in zip(CASES, ours):
        e, a, tp = dpacc(s, q, t, d)
        print(
            f"{s:6.2f} {q:10.6f} {t:9d} {d:7.0e} | {e:11.6f} {a:6.1f} | {o['eps']:11.6f} {o['order']:8.3f} "
            f"{o['eps_compat']:11.6f} | {tp*1e3:7.2f}ms {o['seconds']*1e3:7.3f}ms {tp/o['seconds']:6.1f}x"
        )
    print("eps dpaudit: default grid + continuous order refinement; eps compat: dp_accounting's grid.")
    print("ratio = dp_accounting time / dpaudit time (default accountant).")


if __name__ == "__main__":
    sys.exit(main())
