"""Embeddings for the pipeline tests, made from the real UCI digits (fixtures/data/digits.csv.gz).

Each 8x8 image (64 pixels in 0..16) is centred per pixel (mean over all 1797 rows subtracted)
and multiplied by a fixed random projection R (64 x 16, entries N(0, 1/16), numpy
default_rng(20240617)). The rows are NOT normalised: the mechanisms normalise them, and the
sensitivity audit shows what happens when an implementation forgets to.

Files written (header e0..e15, one row per image, in the original row order):
  digits-proj16-label3.csv   every image with label 3 (n = 183): DPAgg-TI's private "style" set
  digits-proj16-private.csv  rows 0..1199: DP-RDM's private retrieval set
  digits-proj16-public.csv   rows 1200..1596: DP-RDM's public retrieval set
  digits-proj16-queries.csv  rows 1597..1796: DP-RDM's queries

Run from the repository root: python3 scripts/make_digit_embeddings.py (numpy 2.x). Not part of CI.
"""
import gzip, csv
import numpy as np

rows = list(csv.reader(gzip.open("fixtures/data/digits.csv.gz", "rt")))
data = np.array([[float(v) for v in r] for r in rows if r and r[0].strip() and not r[0].startswith("#")])
x, y = data[:, :64], data[:, 64].astype(int)
assert x.shape == (1797, 64), x.shape
rng = np.random.default_rng(20240617)
proj = rng.normal(0.0, 1.0 / np.sqrt(16), size=(64, 16))
emb = (x - x.mean(axis=0)) @ proj

def write(path, m):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow([f"e{i}" for i in range(m.shape[1])])
        for r in m:
            w.writerow([f"{v:.9g}" for v in r])

write("fixtures/embeddings/digits-proj16-label3.csv", emb[y == 3])
write("fixtures/embeddings/digits-proj16-private.csv", emb[:1200])
write("fixtures/embeddings/digits-proj16-public.csv", emb[1200:1597])
write("fixtures/embeddings/digits-proj16-queries.csv", emb[1597:])
print("label3", (y == 3).sum(), "norms", np.linalg.norm(emb, axis=1).min(), np.linalg.norm(emb, axis=1).max())
