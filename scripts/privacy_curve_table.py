#!/usr/bin/env python3
"""The table and figure of the empirical privacy curve (docs/attacks.md), from the runs that
scripts/privacy_curve.sh wrote: one row per accounted ε, with the black-box attack metrics, the
black-box one-run bound (input canaries), the white-box bounds (gradient canaries) and the ledger's
ε, all read from each run's mia/mia.json. Writes the Markdown table to stdout and the figure
(ε accounted vs ε audited, log-log where finite) as SVG.

    python3 scripts/privacy_curve_table.py curve --svg docs/img/privacy-curve.svg
"""
import argparse
import json
import math
import os

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("root", help="the folder scripts/privacy_curve.sh wrote (eps-1, eps-4, eps-8, eps-inf)")
ap.add_argument("--svg", default=None, help="write the figure here")
a = ap.parse_args()


def load(name):
    with open(os.path.join(a.root, name, "mia", "mia.json")) as f:
        return json.load(f)


def fmt(x, d=3):
    if x is None:
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞"
    return f"{x:.{d}f}"


rows = []
for name in sorted(os.listdir(a.root)):
    if not name.startswith("eps-") or not os.path.isfile(os.path.join(a.root, name, "mia", "mia.json")):
        continue
    d = load(name)
    dp = (d.get("target") or {}).get("dp")
    ledger = dp["epsilon"] if dp else math.inf
    best = max(d["results"], key=lambda r: r["auc"])
    loss = max((r for r in d["results"] if r["attack"] == "loss"), key=lambda r: r["auc"])
    bb = (d.get("one_run") or {}).get("epsilon_lower")
    wb = d.get("white_box")
    rows.append(
        dict(
            ledger=ledger,
            sigma=dp["noise_multiplier"] if dp else None,
            loss=loss,
            best=best,
            bb=bb,
            bb_canaries=(d.get("one_run") or {}).get("canaries"),
            wb=wb,
        )
    )
rows.sort(key=lambda r: r["ledger"])

print(
    "| ε accounted (ledger) | σ | loss AUC [95 %] (best t) | best attack AUC [95 %] | TPR @ 1 % FPR (best) "
    "| black-box one-run ε ≥ | white-box Steinke ε ≥ | white-box f-DP ε ≥ | white-box Gaussian shift ε ≥ | white-box best ε ≥ |"
)
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    l, b, w = r["loss"], r["best"], r["wb"]
    print(
        "| {} | {} | {} [{}, {}] (t = {}) | {} {} [{}, {}] (t = {}) | {} | {} | {} | {} | {} | {} |".format(
            fmt(r["ledger"]),
            fmt(r["sigma"], 2) if r["sigma"] else "– (no DP)",
            fmt(l["auc"]), fmt(l["auc_ci"]["lo"]), fmt(l["auc_ci"]["hi"]), l["t"],
            b["attack"], fmt(b["auc"]), fmt(b["auc_ci"]["lo"]), fmt(b["auc_ci"]["hi"]), b["t"],
            fmt(b["tpr_at_1pct_fpr"]),
            fmt(r["bb"]),
            fmt(w["steinke"]["epsilon_lower"]) if w else "–",
            fmt(w["fdp"]["epsilon_lower"]) if w else "–",
            fmt(w["gaussian"]["epsilon_lower"]) if w else "–",
            fmt(w["epsilon_lower"]) if w else "–",
        )
    )

if a.svg:
    # ε accounted (x) vs ε audited (y), both on a log scale from 0.01 to 20; ∞ drawn at the
    # right edge; a zero bound drawn at the bottom edge. The diagonal is "audit = ledger".
    W, H, L, B, R, T = 560, 420, 70, 60, 20, 30
    lo, hi = math.log10(0.01), math.log10(20)

    def X(v):
        v = 20 if math.isinf(v) else max(v, 0.01)
        return L + (math.log10(v) - lo) / (hi - lo) * (W - L - R)

    def Y(v):
        v = min(max(v, 0.01), 20)
        return H - B - (math.log10(v) - lo) / (hi - lo) * (H - B - T)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    for v in (0.01, 0.1, 1, 10):
        out.append(f'<line x1="{X(v):.1f}" y1="{T}" x2="{X(v):.1f}" y2="{H - B}" stroke="#ddd"/>')
        out.append(f'<line x1="{L}" y1="{Y(v):.1f}" x2="{W - R}" y2="{Y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{X(v):.1f}" y="{H - B + 16}" text-anchor="middle">{v:g}</text>')
        out.append(f'<text x="{L - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    out.append(f'<text x="{X(20):.1f}" y="{H - B + 16}" text-anchor="middle">∞</text>')
    out.append(f'<line x1="{X(0.01):.1f}" y1="{Y(0.01):.1f}" x2="{X(20):.1f}" y2="{Y(20):.1f}" stroke="#888" stroke-dasharray="4 3"/>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 18}" text-anchor="middle">ε accounted (ledger, δ = 1e-5)</text>')
    out.append(f'<text transform="translate(18 {(T + H - B) / 2}) rotate(-90)" text-anchor="middle">ε audited (95 % lower bound; 0 drawn at 0.01)</text>')
    series = [
        ("white-box, best of the four", "#d62728", lambda r: r["wb"]["epsilon_lower"] if r["wb"] else None),
        ("white-box Steinke et al.", "#ff7f0e", lambda r: r["wb"]["steinke"]["epsilon_lower"] if r["wb"] else None),
        ("black-box one-run (input canaries)", "#1f77b4", lambda r: r["bb"]),
    ]
    for i, (label, color, get) in enumerate(series):
        pts = [(X(r["ledger"]), Y(get(r))) for r in rows if get(r) is not None]
        if len(pts) > 1:
            out.append('<polyline fill="none" stroke="{}" points="{}"/>'.format(color, " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)))
        for x, y in pts:
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{color}"/>')
        out.append(f'<circle cx="{L + 16}" cy="{T + 14 + 18 * i}" r="4" fill="{color}"/>')
        out.append(f'<text x="{L + 26}" y="{T + 18 + 18 * i}">{label}</text>')
    out.append(f'<text x="{L + 26}" y="{T + 18 + 18 * 3}" fill="#666">dashed: audited = accounted</text>')
    out.append("</svg>")
    with open(a.svg, "w") as f:
        f.write("\n".join(out) + "\n")
