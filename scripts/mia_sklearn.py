#!/usr/bin/env python3
"""Recompute AUC and TPR at 1% / 0.1% FPR of every (attack, t) pair of a scores CSV written by
`dpaudit mia --scores-out FILE.csv` (or any file with the columns record_id, member, attack, t,
score[, set]) with scikit-learn, to compare with dpaudit's own numbers.

Not part of CI. Usage (in a venv with numpy and scikit-learn):

    dpaudit mia --checkpoint models/digits-mlp.toml --scores-out /tmp/scores.csv --format csv --out /tmp/mia.csv
    python3 scripts/mia_sklearn.py /tmp/scores.csv [/tmp/mia.csv]

With the second argument (dpaudit's `--format csv` output) each pair's AUC and TPRs are compared
and the largest absolute difference is printed; the script exits 1 if it exceeds 1e-12.
"""
import csv
import sys
from collections import OrderedDict

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve


def tpr_at(fpr, tpr, target):
    """Largest TPR among ROC points with FPR <= target (dpaudit's convention)."""
    ok = fpr <= target + 1e-15
    return float(tpr[ok].max()) if ok.any() else 0.0


def main():
    pairs = OrderedDict()
    with open(sys.argv[1], newline="") as f:
        for row in csv.DictReader(f):
            if row.get("set", "split") not in ("", "split"):
                continue
            key = (row["attack"], int(row["t"]))
            member = row["member"].strip().lower() in ("1", "true")
            pairs.setdefault(key, ([], []))
            pairs[key][0].append(1 if member else 0)
            pairs[key][1].append(float(row["score"]))
    ours = {}
    for key, (y, s) in pairs.items():
        y, s = np.array(y), np.array(s)
        fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
        ours[key] = (roc_auc_score(y, s), tpr_at(fpr, tpr, 0.01), tpr_at(fpr, tpr, 0.001))
        print("%-10s t=%-5d AUC %.6f  TPR@1%% %.6f  TPR@0.1%% %.6f" % (key[0], key[1], *ours[key]))
    if len(sys.argv) > 2:
        worst = 0.0
        with open(sys.argv[2], newline="") as f:
            for row in csv.DictReader(f):
                if row["shuffled_labels"] == "true":
                    continue
                key = (row["attack"], int(row["t"]))
                theirs = (float(row["auc"]), float(row["tpr_at_1pct_fpr"]), float(row["tpr_at_01pct_fpr"]))
                worst = max(worst, *(abs(a - b) for a, b in zip(ours[key], theirs)))
        print("largest |scikit-learn - dpaudit| over AUC and TPR@FPR: %g" % worst)
        sys.exit(0 if worst <= 1e-12 else 1)


if __name__ == "__main__":
    main()
