#!/usr/bin/env python3
"""DP-SGD on a diffusers UNet2DModel: dpaudit against Opacus (outside CI).

1. Builds the `tiny` preset UNet2DModel in diffusers (seeded), saves it as the initial weights,
   draws one batch (x_t, t, eps) and computes the per-sample gradients of the per-sample
   mean-squared eps error with PyTorch autograd (one backward pass per sample), their norms, and
   the clipped, un-noised sum sum_i min(1, C/(||g_i|| + 1e-6)) g_i (Opacus' DPOptimizer
   clipping), with C the median norm so that about half of the samples are clipped. Opacus'
   GradSampleModule is run on the same batch and reported against that reference: with
   opacus 1.6.0 and torch 2.15 it returns zero or wrong weight gradients for several
   convolutions of this diffusers UNet (mid block, first up block), so the checks below use the
   autograd loop, the definition Opacus' grad samplers implement.
2. Runs `dpaudit model grads` on the same weights and batch (the batched per-sample pass,
   `--per-sample-loop`, one backward per sample, and `--hand-written`, the CPU pass `train --unet`
   runs): norms and the clipped sum must agree to 1e-4
   relative.
3. Trains with `dpaudit train --unet <the same config.json> --dp` (sigma, q, steps below) and
   checks the ledger's epsilon (the card's, the tightest sound accountant) against Opacus'
   RDPAccountant (must be <=) and prv_accountant's lower bound (must be >=) for the same
   (sigma, q, steps, delta).
4. Loads every folder `train` wrote (a DP one and a non-DP one) with diffusers'
   UNet2DModel.from_pretrained / DDPMScheduler.from_pretrained and checks the UNet's output
   against `dpaudit model eval` to 1e-4 (relative L2).

Usage: python scripts/compare_dpsgd_opacus.py [--dpaudit target/release/dpaudit] [--keep DIR]
Needs torch, diffusers, opacus, prv_accountant, safetensors, numpy (PyPI). Exit 1 on a failure.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import tomllib

import numpy as np
import torch
from diffusers import DDPMScheduler, UNet2DModel
from opacus import GradSampleModule
from opacus.accountants import RDPAccountant
from prv_accountant import PRVAccountant
from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism
from safetensors.numpy import load_file

ROOT = pathlib.Path(__file__).resolve().parent.parent

# The `tiny` preset of `dpaudit train --unet` (src/models/diffusers_train.rs).
TINY = dict(
    sample_size=28, in_channels=1, out_channels=1, layers_per_block=1,
    block_out_channels=(8, 16), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
    up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4, attention_head_dim=4,
)
SIGMA, Q, STEPS, DELTA = 1.0, 0.25, 20, 1e-5
TOL = 1e-4
failures = []


def check(name, ok, detail):
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    if not ok:
        failures.append(name)


def run(bin_, *args):
    r = subprocess.run([str(bin_), *map(str, args)], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"dpaudit {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}")
    return r


def rel_l2(a, b):
    return float(np.linalg.norm((a - b).ravel()) / max(np.linalg.norm(b.ravel()), 1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dpaudit", default=str(ROOT / "target/release/dpaudit"))
    ap.add_argument("--keep", help="work in this folder and keep it")
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args()
    work = pathlib.Path(a.keep) if a.keep else pathlib.Path(tempfile.mkdtemp(prefix="dpsgd-opacus-"))
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)

    # 1. Initial weights and one batch.
    init = work / "init"
    model = UNet2DModel(**TINY)
    model.save_pretrained(init, safe_serialization=True)
    sched = DDPMScheduler(num_train_timesteps=1000, beta_start=1e-4, beta_end=0.02, beta_schedule="linear")
    sched.save_pretrained(init)
    b = a.batch
    x0 = torch.rand(b, 1, 28, 28) * 2 - 1
    t = torch.randint(0, 1000, (b,), dtype=torch.int64)
    eps = torch.randn(b, 1, 28, 28)
    abar = sched.alphas_cumprod[t].view(b, 1, 1, 1)
    xt = (abar.sqrt() * x0 + (1 - abar).sqrt() * eps).float()
    np.save(work / "input.npy", xt.numpy())
    np.save(work / "timesteps.npy", t.numpy())
    np.save(work / "noise.npy", eps.numpy())

    # The reference: PyTorch autograd, one backward pass per sample (what a per-sample
    # gradient is by definition).
    model.train()
    per = {}
    for i in range(b):
        model.zero_grad()
        ((model(xt[i:i + 1], t[i:i + 1]).sample - eps[i:i + 1]) ** 2).mean().backward()
        for n, p in model.named_parameters():
            per.setdefault(n, []).append(p.grad.detach().double().numpy().copy())
    per = {n: np.stack(v) for n, v in per.items()}
    norms_o = np.sqrt(sum((g.reshape(b, -1) ** 2).sum(1) for g in per.values()))
    clip = float(np.median(norms_o))
    factor = np.minimum(1.0, clip / (norms_o + 1e-6))
    sum_o = {n: np.tensordot(factor, g, axes=(0, 0)) for n, g in per.items()}
    print(f"batch of {b}: per-sample norms (autograd loop) {np.round(norms_o, 5).tolist()}; C = {clip:.4f}")

    # Opacus' GradSampleModule on the same model and batch (train mode: in eval mode its hooks
    # capture no activations). Reported against the autograd loop; see the docstring.
    model.zero_grad()
    gsm = GradSampleModule(model, loss_reduction="sum")
    ((gsm(xt, t).sample - eps) ** 2).mean(dim=(1, 2, 3)).sum().backward()
    opac = {n.removeprefix("_module."): p.grad_sample.detach().double().numpy()
            for n, p in gsm.named_parameters() if p.requires_grad}
    gsm.disable_hooks()
    norms_opacus = np.sqrt(sum((g.reshape(b, -1) ** 2).sum(1) for g in opac.values()))
    r = float(np.max(np.abs(norms_opacus - norms_o) / norms_o))
    wrong = [n for n in per if rel_l2(opac[n], per[n]) > TOL and np.linalg.norm(per[n]) > 1e-6 * np.linalg.norm(norms_o)]
    print(f"note Opacus GradSampleModule against the autograd loop: norms differ by up to {r:.2e}; "
          f"{len(wrong)} parameter(s) differ by > {TOL:g} relative: {wrong}")

    # 2. dpaudit's per-sample gradients on the same weights and batch.
    for mode, extra in [("batched", []), ("loop", ["--per-sample-loop"]), ("hand-written", ["--hand-written"])]:
        g = work / f"grads-{mode}"
        run(a.dpaudit, "model", "grads", "--checkpoint", init, "--input", work / "input.npy",
            "--timesteps", work / "timesteps.npy", "--noise", work / "noise.npy", "--clip", clip,
            "--out", g, "--force", *extra)
        norms_d = np.load(g / "norms.npy").astype(np.float64)
        r = float(np.max(np.abs(norms_d - norms_o) / norms_o))
        check(f"per-sample norms ({mode})", r <= TOL, f"max relative difference {r:.2e}")
        sum_d = load_file(g / "clipped_sum.safetensors")
        missing = sorted(set(sum_o) ^ set(sum_d))
        check(f"parameter names ({mode})", not missing, f"{len(sum_o)} parameters, mismatched: {missing[:5]}")
        flat_o = np.concatenate([sum_o[n].ravel() for n in sorted(sum_o)])
        flat_d = np.concatenate([sum_d[n].astype(np.float64).ravel() for n in sorted(sum_o)])
        # Worst single parameter, among those whose gradient is not zero in exact arithmetic
        # (the attention key bias is: softmax ignores a constant added to every score).
        big = [n for n in sum_o if np.linalg.norm(sum_o[n]) > 1e-6 * np.linalg.norm(flat_o)]
        worst = max((rel_l2(sum_d[n].astype(np.float64), sum_o[n]), n) for n in big)
        r = rel_l2(flat_d, flat_o)
        check(f"clipped un-noised sum ({mode})", r <= TOL,
              f"relative L2 {r:.2e} over all parameters; worst parameter {worst[1]} {worst[0]:.2e}")

    # 3. The ledger's epsilon against Opacus' RDP and PRV's lower bound.
    dp_dir = work / "dp"
    r = run(a.dpaudit, "train", "--unet", init / "config.json", "--dp", "--noise-multiplier", SIGMA,
            "--clip", 1.0, "--sample-rate", Q, "--steps", STEPS, "--delta", DELTA, "--lr", 2e-3,
            "--seed", 0, "--out", dp_dir, "--force", "--quiet")
    card = tomllib.loads((dp_dir / "dpaudit-card.toml").read_text())
    eps_d = card["dp"]["epsilon"]
    acc = RDPAccountant()
    acc.history = [(SIGMA, Q, STEPS)]
    eps_rdp = acc.get_epsilon(delta=DELTA)
    prv = PRVAccountant(prvs=[PoissonSubsampledGaussianMechanism(noise_multiplier=SIGMA, sampling_probability=Q)],
                        max_self_compositions=[STEPS], eps_error=0.01, delta_error=DELTA / 1000)
    lo, est, up = prv.compute_epsilon(delta=DELTA, num_self_compositions=[STEPS])
    print(f"sigma = {SIGMA}, q = {Q}, {STEPS} steps, delta = {DELTA}: dpaudit {eps_d:.6f} "
          f"({card['dp']['epsilon_accountant']}); Opacus RDP {eps_rdp:.6f}; PRV [{lo:.6f}, {est:.6f}, {up:.6f}]")
    check("ledger epsilon <= Opacus RDP epsilon", eps_d <= eps_rdp, f"{eps_d:.6f} <= {eps_rdp:.6f}")
    check("ledger epsilon >= PRV lower bound", eps_d >= lo, f"{eps_d:.6f} >= {lo:.6f}")

    # 4. diffusers loads every folder train writes; its output matches `dpaudit model eval`.
    plain = work / "plain"
    run(a.dpaudit, "train", "--unet", "tiny", "--steps", 20, "--batch-size", 16, "--lr", 2e-3,
        "--seed", 1, "--out", plain, "--force", "--quiet")
    for folder in [dp_dir, plain]:
        m = UNet2DModel.from_pretrained(folder).eval()
        DDPMScheduler.from_pretrained(folder)
        with torch.no_grad():
            want = m(xt, t).sample.numpy()
        pred = work / f"pred-{folder.name}.npy"
        run(a.dpaudit, "model", "eval", "--checkpoint", folder, "--input", work / "input.npy",
            "--timesteps", work / "timesteps.npy", "--out", pred, "--force")
        got = np.load(pred)
        r = rel_l2(got.astype(np.float64), want.astype(np.float64))
        check(f"diffusers loads {folder.name}/ and matches model eval", r <= TOL,
              f"relative L2 {r:.2e}, max abs {float(np.max(np.abs(got - want))):.2e}")
    print(json.dumps({"failures": failures, "work": str(work)}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
