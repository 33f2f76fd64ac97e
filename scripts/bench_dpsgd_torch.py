#!/usr/bin/env python3
"""DP-SGD steps/s on the MNIST UNet (models/mnist-ddpm's architecture, 176,849 parameters):
dpaudit against PyTorch on the same CPU with the same thread count (outside CI).

One DP-SGD step = the per-sample gradients of 128 samples (x_t, t, eps) of the eps-prediction
loss, Opacus' clipping min(1, C/(||g_i|| + 1e-6)), the sum, Gaussian noise sigma*C, / 128, Adam.

* dpaudit: `dpaudit train --unet mnist-ddpm --dp --sample-rate 1` on the 128 members of
  fixtures/splits/mnist.toml (every step is the full 128), per-sample gradients in chunks of 32
  (`--max-physical-batch-size 32`); the time of one step is (time of 1 + STEPS steps - time of 1 step) / STEPS,
  so start-up and the evaluation losses cancel, each time the fastest of REPS runs. RAYON_NUM_THREADS = threads.
* PyTorch, torch.func: vmap(grad(loss)) over the batch in chunks of 32 (the per-sample
  gradients PyTorch's functorch computes), then the same clipping, noise and torch.optim.Adam.
* PyTorch, Opacus: GradSampleModule (opacus 1.6.0) forward/backward in chunks of 32, the
  per-sample gradients from p.grad_sample, then the same clipping, noise and Adam. On this
  diffusers UNet Opacus' per-sample gradients are wrong for several convolutions
  (scripts/compare_dpsgd_opacus.py), so its time is for the work Opacus does, not a correct step.
torch.set_num_threads(threads). Reports CPU seconds (user + system) and wall seconds per step,
and steps/s from each; on a shared machine quote the CPU-time ratios of the 1-thread runs.

Usage: python scripts/bench_dpsgd_torch.py [--dpaudit target/release/dpaudit] [--threads 1 2]
       [--steps 3] [--reps 2]
"""
import argparse
import json
import os
import pathlib
import resource
import subprocess
import tempfile
import time

import torch
from diffusers import UNet2DModel

ROOT = pathlib.Path(__file__).resolve().parent.parent
B, CHUNK, SIGMA, CLIP = 128, 32, 1.0, 1.0


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def dpaudit_step(bin_, threads, steps, reps):
    def run(k):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
            c0, w0 = children_cpu(), time.perf_counter()
            subprocess.run([bin_, "train", "--unet", "mnist-ddpm", "--dp", "--sample-rate", "1",
                            "--noise-multiplier", str(SIGMA), "--clip", str(CLIP), "--steps", str(k),
                            "--max-physical-batch-size", str(CHUNK), "--seed", "0", "--out", f"{d}/m", "--quiet"],
                           cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
            return children_cpu() - c0, time.perf_counter() - w0
    # The fastest of `reps` runs of each length (as PyTorch's side takes its fastest step), the
    # lengths alternated, so that a burst of load on a shared machine does not land in one only.
    short, long_ = [], []
    for _ in range(reps):
        short.append(run(1))
        long_.append(run(1 + steps))
    c1, w1 = min(c for c, _ in short), min(w for _, w in short)
    ck, wk = min(c for c, _ in long_), min(w for _, w in long_)
    return (ck - c1) / steps, (wk - w1) / steps


def model():
    cfg = json.load(open(ROOT / "models/mnist-ddpm/config.json"))
    torch.manual_seed(0)
    m = UNet2DModel.from_config(cfg)
    m.train()
    return m


def batch():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(B, 1, 28, 28, generator=g), torch.randint(0, 1000, (B,), generator=g),
            torch.randn(B, 1, 28, 28, generator=g))


def release(m, per_sample, opt):
    """Opacus' clipping of the per-sample gradients (dict name -> [B, ...]), sum, noise, Adam."""
    names = [n for n, _ in m.named_parameters()]
    norms = torch.sqrt(sum(per_sample[n].flatten(1).pow(2).sum(1) for n in names))
    f = (CLIP / (norms + 1e-6)).clamp(max=1.0)
    for n, p in m.named_parameters():
        s = torch.einsum("b,b...->...", f, per_sample[n])
        p.grad = (s + torch.randn_like(s) * SIGMA * CLIP) / B
    opt.step()


def vmap_step(m, opt, x, t, e):
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in m.named_parameters()}

    def loss(p, xi, ti, ei):
        out = functional_call(m, p, (xi[None], ti[None])).sample
        return ((out - ei[None]) ** 2).mean()

    g = vmap(grad(loss), in_dims=(None, 0, 0, 0), chunk_size=CHUNK)(params, x, t, e)
    release(m, g, opt)


def opacus_step(gsm, m, opt, x, t, e):
    parts = {n: [] for n, _ in m.named_parameters()}
    for s in range(0, B, CHUNK):
        gsm.zero_grad(set_to_none=True)
        out = gsm(x[s:s + CHUNK], t[s:s + CHUNK]).sample
        ((out - e[s:s + CHUNK]) ** 2).flatten(1).mean(1).sum().backward()
        for n, p in m.named_parameters():
            gs = p.grad_sample if p.grad_sample is not None else torch.zeros(CHUNK, *p.shape)
            parts[n].append(gs.detach().clone())
            p.grad_sample = None
    release(m, {n: torch.cat(v) for n, v in parts.items()}, opt)


def timed(fn, reps):
    fn()  # warm-up
    cpu, wall = [], []
    for _ in range(reps):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return min(cpu), min(wall)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dpaudit", default=str(ROOT / "target/release/dpaudit"))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    import opacus
    from opacus import GradSampleModule

    print(f"torch {torch.__version__}, opacus {opacus.__version__}; batch {B} (chunks of {CHUNK}), "
          f"sigma {SIGMA}, C {CLIP}")
    print("threads  implementation          CPU s/step  wall s/step  steps/s (CPU)  dpaudit/this (CPU)")
    for th in a.threads:
        torch.set_num_threads(th)
        ours = dpaudit_step(a.dpaudit, th, a.steps, a.reps)
        x, t, e = batch()
        m = model()
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        fv = timed(lambda: vmap_step(m, opt, x, t, e), a.reps)
        m2 = model()
        gsm = GradSampleModule(m2, loss_reduction="sum")
        opt2 = torch.optim.Adam(m2.parameters(), lr=1e-3)
        fo = timed(lambda: opacus_step(gsm, m2, opt2, x, t, e), a.reps)
        for name, (c, w) in (("dpaudit", ours), ("torch.func vmap", fv), ("opacus GradSampleModule", fo)):
            print(f"{th:7d}  {name:24s} {c:10.3f}  {w:11.3f}  {1 / c:13.3f}  {fv[0] / ours[0] if name == 'torch.func vmap' else (fo[0] / ours[0] if name.startswith('opacus') else 1.0):18.2f}")


if __name__ == "__main__":
    main()
