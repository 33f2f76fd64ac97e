"""Trains a small DDPM UNet2DModel (diffusers) on the members of an MNIST split and saves it in
diffusers format (config.json, diffusion_pytorch_model.safetensors, scheduler_config.json), as
the non-DP target that `dpaudit mia` attacks (models/mnist-ddpm/). Run outside CI:

    /tmp/venv/bin/python scripts/train_mnist_ddpm.py --split fixtures/splits/mnist.toml \
        --out models/mnist-ddpm --minutes 30

Training is plain DDPM (Ho et al. 2020, Algorithm 1): x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps
with t uniform on 0..T-1, loss ||eps - eps_theta(x_t, t)||^2, AdamW, linear beta 1e-4..0.02 over
T = 1000. No DP. The folder is round-tripped through diffusers (from_pretrained gives the same
output) and a training record (training.json: split hashes, steps, seed, steps/s) is written.
"""
import argparse
import gzip
import hashlib
import json
import os
import time
import tomllib

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, UNet2DModel


def load_mnist(path):
    raw = gzip.decompress(open(path, "rb").read())
    rec = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 785)
    x = rec[:, 1:].astype(np.float32) / 127.5 - 1.0
    return x.reshape(-1, 1, 28, 28), rec[:, 0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a loaded machine)")
    ap.add_argument("--init", help="continue from this diffusers folder (its training.json is extended)")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    split = tomllib.load(open(a.split, "rb"))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(a.split))))
    data_path = os.path.join(root, split["data"])
    assert hashlib.sha256(open(data_path, "rb").read()).hexdigest() == split["data_sha256"]
    x, _ = load_mnist(data_path)
    members = torch.from_numpy(x[split["members"]])
    model = UNet2DModel(
        sample_size=28, in_channels=1, out_channels=1, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8, attention_head_dim=8,
    )
    prior = None
    if a.init:
        model = UNet2DModel.from_pretrained(a.init)
        prior = json.load(open(os.path.join(a.init, "training.json")))
    sched = DDPMScheduler(num_train_timesteps=1000, beta_schedule="linear", beta_start=1e-4, beta_end=0.02,
                          prediction_type="epsilon")
    abar = sched.alphas_cumprod
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    n = members.shape[0]
    start = time.time()
    step = 0
    losses = []
    model.train()
    while step < a.max_steps and time.time() - start < a.minutes * 60:
        idx = torch.randint(0, n, (a.batch,))
        x0 = members[idx]
        t = torch.randint(0, 1000, (a.batch,))
        eps = torch.randn_like(x0)
        ab = abar[t].view(-1, 1, 1, 1)
        xt = ab.sqrt() * x0 + (1 - ab).sqrt() * eps
        loss = F.mse_loss(model(xt, t).sample, eps)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        step += 1
        if step % 50 == 0:
            el = time.time() - start
            print(f"step {step}  loss {np.mean(losses[-50:]):.4f}  {step / el:.2f} steps/s", flush=True)
    elapsed = time.time() - start
    model.eval()
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    sched.save_pretrained(a.out)
    # from_pretrained (--init) records the folder it read; the shipped config names no local path.
    cfg_path = os.path.join(a.out, "config.json")
    cfg = json.load(open(cfg_path))
    if cfg.pop("_name_or_path", None) is not None:
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")
    # Round trip through diffusers.
    back = UNet2DModel.from_pretrained(a.out).eval()
    with torch.no_grad():
        xt = torch.randn(4, 1, 28, 28)
        tt = torch.tensor([0, 10, 100, 999])
        assert torch.equal(model(xt, tt).sample, back(xt, tt).sample)
    rec = {
        "trained_on": "members",
        "split": os.path.relpath(os.path.abspath(a.split), root),
        "members_sha256": split["members_sha256"],
        "data_sha256": split["data_sha256"],
        "rows": n,
        "steps": step + (prior["steps"] if prior else 0),
        "runs": ((prior.get("runs") or [{"steps": prior["steps"]}]) if prior else []) + [{"steps": step, "seconds": elapsed}],
        "batch_size": a.batch,
        "lr": a.lr,
        "seed": a.seed,
        "dp": None,
        "final_loss_mean_last_500": float(np.mean(losses[-500:])),
        "train_steps_per_s": step / elapsed,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "command": "python scripts/train_mnist_ddpm.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items()),
    }
    with open(os.path.join(a.out, "training.json"), "w") as f:
        json.dump(rec, f, indent=1)
        f.write("\n")
    print(json.dumps(rec, indent=1))


if __name__ == "__main__":
    main()
