"""The PyTorch anchor for dpaudit's SecMI throughput: the same computation as
`dpaudit mia --attack secmi` (src/attacks/mia.rs: deterministic DDIM inversion of x0 in steps of
k to t - k, one step forward to t and one back, score -mean((x_back - x_{t-k})^2)) on the same
diffusers checkpoint and images, batched, on the CPU. Prints images/s and writes the scores so
they can be compared with dpaudit's. Run outside CI:

    /tmp/venv/bin/python scripts/bench_secmi_torch.py --checkpoint models/mnist-ddpm \
        --split fixtures/splits/mnist.toml --n 200 --t 100 --k 10 --batch 64
"""
import argparse
import gzip
import json
import time
import tomllib

import numpy as np
import torch
from diffusers import DDPMScheduler, UNet2DModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--split", required=True)
    ap.add_argument("--n", type=int, default=200, help="members and non-members each")
    ap.add_argument("--t", type=int, default=100)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    split = tomllib.load(open(a.split, "rb"))
    raw = gzip.decompress(open(split["data"], "rb").read())
    rec = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 785)
    x = (rec[:, 1:].astype(np.float32) / 127.5 - 1.0).reshape(-1, 1, 28, 28)
    ix = split["members"][: a.n] + split["nonmembers"][: a.n]
    x0 = torch.from_numpy(x[ix])
    model = UNet2DModel.from_pretrained(a.checkpoint).eval()
    abar = DDPMScheduler.from_pretrained(a.checkpoint).alphas_cumprod.double()

    def step(xs, s, t):
        eps = model(xs, torch.full((xs.shape[0],), s, dtype=torch.int64)).sample.double()
        x0h = (xs.double() - (1 - abar[s]).sqrt() * eps) / abar[s].sqrt()
        return (abar[t].sqrt() * x0h + (1 - abar[t]).sqrt() * eps).float()

    scores = []
    start = time.time()
    with torch.no_grad():
        for b in range(0, x0.shape[0], a.batch):
            xs = x0[b:b + a.batch]
            target, s = a.t - a.k, 0
            while s < target:
                nxt = min(s + a.k, target)
                xs = step(xs, s, nxt)
                s = nxt
            fwd = step(xs, target, a.t)
            back = step(fwd, a.t, target)
            scores.extend((-((back - xs) ** 2).flatten(1).mean(1)).tolist())
    el = time.time() - start
    n = x0.shape[0]
    print(json.dumps({"images": n, "seconds": el, "images_per_s": n / el, "threads": a.threads,
                      "t": a.t, "k": a.k, "batch": a.batch, "torch": torch.__version__}))
    np.save("/tmp/secmi_torch_scores.npy", np.array(scores))


if __name__ == "__main__":
    main()
