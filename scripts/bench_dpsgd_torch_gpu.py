"""DP-SGD steps/s of the mnist-ddpm UNet in PyTorch (per-sample gradients with torch.func vmap,
clip, Gaussian noise, Adam, EMA), the work of one `dpaudit train --unet mnist-ddpm --dp` step.

    python3 scripts/bench_dpsgd_torch_gpu.py --config models/mnist-ddpm/config.json --batch 120 --steps 20
"""
import argparse
import copy
import json
import time

import torch
from diffusers import UNet2DModel
from torch.func import functional_call, grad, vmap

ap = argparse.ArgumentParser()
ap.add_argument("--config", required=True)
ap.add_argument("--batch", type=int, default=120)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--device", default="cuda")
ap.add_argument("--json")
a = ap.parse_args()
dev = torch.device(a.device)
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.manual_seed(0)
cfg = json.load(open(a.config))
model = UNet2DModel.from_config(cfg).to(dev).train()
ema = copy.deepcopy(model).eval()
params = {k: v.detach() for k, v in model.named_parameters()}
names = list(params)
opt = torch.optim.Adam(model.parameters(), lr=2e-3)
abar = torch.cumprod(1 - torch.linspace(1e-4, 0.02, 1000, device=dev), 0)
side, ch = cfg["sample_size"], cfg["in_channels"]


def loss_one(p, x, t, e):
    out = functional_call(model, p, (x.unsqueeze(0), t.unsqueeze(0))).sample
    return ((out - e.unsqueeze(0)) ** 2).mean()


per_sample = vmap(grad(loss_one), in_dims=(None, 0, 0, 0))
mode = "vmap"


def step():
    global mode
    x0 = torch.rand(a.batch, ch, side, side, device=dev) * 2 - 1
    t = torch.randint(0, 1000, (a.batch,), device=dev)
    e = torch.randn_like(x0)
    ab = abar[t].view(-1, 1, 1, 1)
    xt = ab.sqrt() * x0 + (1 - ab).sqrt() * e
    p = {k: v.detach() for k, v in model.named_parameters()}
    if mode == "vmap":
        try:
            g = per_sample(p, xt, t, e)
        except Exception as ex:  # no batching rule for some op: one backward per sample
            print(f"vmap failed ({type(ex).__name__}: {ex}); per-sample loop", flush=True)
            mode = "loop"
    if mode == "loop":
        g = {k: [] for k in names}
        for i in range(a.batch):
            gi = grad(loss_one)(p, xt[i], t[i], e[i])
            for k in names:
                g[k].append(gi[k])
        g = {k: torch.stack(v) for k, v in g.items()}
    norms = torch.sqrt(sum((g[k].flatten(1) ** 2).sum(1) for k in names))
    scale = (1.0 / (norms + 1e-6)).clamp(max=1.0)
    for k, prm in model.named_parameters():
        s = (g[k] * scale.view(-1, *([1] * (g[k].dim() - 1)))).sum(0)
        prm.grad = (s + torch.randn_like(s) * 1.0) / a.batch
    opt.step()
    with torch.no_grad():
        for pe, pm in zip(ema.parameters(), model.parameters()):
            pe.mul_(0.999).add_(pm, alpha=0.001)


for _ in range(a.warmup):
    step()
torch.cuda.synchronize() if dev.type == "cuda" else None
t0 = time.perf_counter()
for _ in range(a.steps):
    step()
torch.cuda.synchronize() if dev.type == "cuda" else None
dt = time.perf_counter() - t0
res = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", batch=a.batch, steps=a.steps,
           seconds=dt, steps_per_s=a.steps / dt, per_sample=mode)
print(json.dumps(res))
if a.json:
    json.dump(res, open(a.json, "w"), indent=1)
