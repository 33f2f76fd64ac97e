"""Writes a seeded split of the shipped MNIST digits into members, non-members and the rest public,
in dpaudit's split manifest format (sorted 0-based indices; each *_sha256 is SHA-256 of the list
joined by commas; data_sha256 is SHA-256 of the data file). Run from the repository root.

    python3 scripts/make_mnist_split.py
        # fixtures/splits/mnist.toml: 128 members (the training set of models/mnist-ddpm),
        # 128 non-members, seed 0
    python3 scripts/make_mnist_split.py --members 4000 --nonmembers 2000 --seed 1 \
        --out fixtures/splits/mnist-dp.toml --note "models/mnist-dp-ddpm and its non-private twin"
"""
import argparse
import hashlib
import random

DATA = "fixtures/data/mnist/mnist-10k.u8.gz"
N = 10000

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--members", type=int, default=128)
ap.add_argument("--nonmembers", type=int, default=128)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--out", default="fixtures/splits/mnist.toml")
ap.add_argument("--note", default="models/mnist-ddpm")
a = ap.parse_args()
assert a.members + a.nonmembers <= N, "members + non-members exceed the 10,000 rows"


def h(ix):
    return hashlib.sha256(",".join(map(str, ix)).encode()).hexdigest()


ix = list(range(N))
random.Random(a.seed).shuffle(ix)
k, l = a.members, a.members + a.nonmembers
m, nm, pub = sorted(ix[:k]), sorted(ix[k:l]), sorted(ix[l:])
with open(a.out, "w") as f:
    f.write("# Member / non-member / public split of the MNIST digits (row indices, 0-based).\n"
            "# Lists are disjoint; each *_sha256 is SHA-256 of the list joined by commas.\n"
            f"# Made by scripts/make_mnist_split.py; {a.note} {'was' if ' and ' not in a.note else 'were'}"
            " trained on `members`.\n")
    f.write("schema_version = 1\n")
    f.write(f'data = "{DATA}"\n')
    f.write(f'data_sha256 = "{hashlib.sha256(open(DATA, "rb").read()).hexdigest()}"\n')
    f.write(f"seed = {a.seed}\n")
    for name, lst in (("members", m), ("nonmembers", nm), ("public", pub)):
        f.write(f'{name}_sha256 = "{h(lst)}"\n')
    for name, lst in (("members", m), ("nonmembers", nm), ("public", pub)):
        f.write(f"{name} = [{', '.join(map(str, lst))}]\n")
