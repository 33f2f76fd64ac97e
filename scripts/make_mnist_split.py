"""Writes fixtures/splits/mnist.toml: a seeded split of the shipped MNIST digits into 128 members
(the training set of models/mnist-ddpm), 128 non-members and the rest public, in dpaudit's split
manifest format (sorted 0-based indices; each *_sha256 is SHA-256 of the list joined by commas;
data_sha256 is SHA-256 of the data file). Run from the repository root: python3 scripts/make_mnist_split.py
"""
import hashlib
import random

DATA = "fixtures/data/mnist/mnist-10k.u8.gz"
N, MEMBERS, NONMEMBERS, SEED = 10000, 128, 128, 0


def h(ix):
    return hashlib.sha256(",".join(map(str, ix)).encode()).hexdigest()


ix = list(range(N))
random.Random(SEED).shuffle(ix)
m, nm, pub = sorted(ix[:MEMBERS]), sorted(ix[MEMBERS:MEMBERS + NONMEMBERS]), sorted(ix[MEMBERS + NONMEMBERS:])
with open("fixtures/splits/mnist.toml", "w") as f:
    f.write("# Member / non-member / public split of the MNIST digits (row indices, 0-based).\n"
            "# Lists are disjoint; each *_sha256 is SHA-256 of the list joined by commas.\n"
            "# Made by scripts/make_mnist_split.py; models/mnist-ddpm was trained on `members`.\n")
    f.write("schema_version = 1\n")
    f.write(f'data = "{DATA}"\n')
    f.write(f'data_sha256 = "{hashlib.sha256(open(DATA, "rb").read()).hexdigest()}"\n')
    f.write(f"seed = {SEED}\n")
    for name, lst in (("members", m), ("nonmembers", nm), ("public", pub)):
        f.write(f'{name}_sha256 = "{h(lst)}"\n')
    for name, lst in (("members", m), ("nonmembers", nm), ("public", pub)):
        f.write(f"{name} = [{', '.join(map(str, lst))}]\n")
