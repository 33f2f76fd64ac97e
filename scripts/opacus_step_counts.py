"""How Opacus counts DP-SGD steps and its sampling rate, next to dpaudit's --sampling conventions.

Run outside CI with opacus installed (e.g. 1.6.0):
    python scripts/opacus_step_counts.py [path/to/dpaudit]

For each (N, B, E) it prints
  - get_noise_multiplier's count, steps = int(epochs / sample_rate) with sample_rate = B/N
    (opacus/accountants/utils.py), against `dpaudit account ... --sampling poisson`;
  - what PrivacyEngine.make_private(poisson_sampling=True) runs and records over a
    DataLoader(batch_size=B) (tiny linear model, one real epoch loop), against
    `dpaudit account ... --sampling poisson-loader`.
"""
import json
import subprocess
import sys
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset
from opacus import PrivacyEngine

warnings.filterwarnings("ignore")
DPAUDIT = sys.argv[1] if len(sys.argv) > 1 else "target/debug/dpaudit"


def dpaudit(n, b, e, sampling):
    out = subprocess.run(
        [DPAUDIT, "account", "--noise-multiplier", "1", "--epochs", str(e), "--batch-size", str(b),
         "--dataset-size", str(n), "--delta", "1e-5", "--accountant", "pld", "--sampling", sampling,
         "--format", "json"],
        capture_output=True, text=True, check=False)
    d = json.loads(out.stdout)["derivation"]
    return d["steps"], d["sample_rate"]


def engine(n, b, e):
    ds = TensorDataset(torch.randn(n, 2), torch.randint(0, 2, (n,)))
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    pe = PrivacyEngine()
    m, opt, dl = pe.make_private(module=m, optimizer=opt, data_loader=DataLoader(ds, batch_size=b),
                                 noise_multiplier=1.0, max_grad_norm=1.0)
    for _ in range(e):
        for x, y in dl:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
    (_, q, steps), = pe.accountant.history
    return steps, q


for n, b, e in [(60000, 64, 1), (50000, 64, 1), (5952, 64, 2), (2994, 100, 100)]:
    q = b / n
    print(f"N={n} B={b} E={e}")
    print(f"  get_noise_multiplier: steps={int(e / q)} q={q!r}   dpaudit poisson: {dpaudit(n, b, e, 'poisson')}")
    if e <= 2:
        print(f"  PrivacyEngine:        {engine(n, b, e)}   dpaudit poisson-loader: {dpaudit(n, b, e, 'poisson-loader')}")
