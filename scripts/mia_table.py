#!/usr/bin/env python3
"""The docs/attacks.md table of `dpaudit mia` runs: one row per (model, attack, t) with AUC [95 %
interval], TPR at 1 % and 0.1 % FPR, the held-out ASR [95 % interval], and the limits of the
mechanism each report compares with (ASR limit, TPR-at-FPR limits). Reads each run's mia.json.

    python3 scripts/mia_table.py LABEL=RUN_DIR [LABEL=RUN_DIR ...]
"""
import json
import sys


def f(x, d=3):
    return "–" if x is None else f"{x:.{d}f}"


def ci(c, d=3):
    return "" if not c else f" [{c['lo']:.{d}f}, {c['hi']:.{d}f}]"


rows = []
print("| model | attack | t | AUC [95 %] | TPR @ 1 % FPR | TPR @ 0.1 % FPR | held-out ASR [95 %] | ASR limit | TPR @ 1 % limit | TPR @ 0.1 % limit | outcome |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for arg in sys.argv[1:]:
    label, d = arg.split("=", 1)
    v = json.load(open(f"{d}/mia.json"))
    comps = {c["what"]: c for c in v.get("comparisons", [])}
    for r in v["results"]:
        if r.get("shuffled_labels"):
            continue
        lim = r.get("limits") or {}
        c = comps.get(f"{r['attack']} at t = {r['t']}", {})
        print(
            f"| {label} | {r['attack']} | {r['t']} | {f(r['auc'])}{ci(r.get('auc_ci'))} | {f(r['tpr_at_1pct_fpr'])} | "
            f"{f(r['tpr_at_01pct_fpr'])} | {f(r['asr_heldout'])}{ci(r.get('asr_heldout_ci'))} | {f(lim.get('asr'))} | "
            f"{f(lim.get('tpr_at_1pct'))} | {f(lim.get('tpr_at_01pct'))} | {c.get('outcome', '–')} |"
        )
