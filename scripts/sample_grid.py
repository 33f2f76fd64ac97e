#!/usr/bin/env python3
"""An 8×8 grid of samples from a diffusers UNet folder (e.g. models/mnist-dp-ddpm), drawn with
diffusers' DDIMPipeline (η = 0, 100 steps, the folder's scheduler_config.json), as a PNG.

Usage: /work/pyvenv/bin/python scripts/sample_grid.py FOLDER OUT.png [--steps 100] [--seed 0]
"""
import argparse

import numpy as np
import torch
from diffusers import DDIMPipeline, DDIMScheduler, UNet2DModel
from PIL import Image

ap = argparse.ArgumentParser()
ap.add_argument("folder")
ap.add_argument("out")
ap.add_argument("--steps", type=int, default=100)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--n", type=int, default=8, help="grid side")
a = ap.parse_args()
unet = UNet2DModel.from_pretrained(a.folder)
sched = DDIMScheduler.from_pretrained(a.folder)
pipe = DDIMPipeline(unet=unet, scheduler=sched)
g = torch.Generator().manual_seed(a.seed)
imgs = pipe(batch_size=a.n * a.n, generator=g, num_inference_steps=a.steps, eta=0.0, output_type="np").images
imgs = (np.clip(imgs, 0, 1) * 255).round().astype(np.uint8)  # [N, H, W, C]
n, h, w, c = imgs.shape
grid = imgs.reshape(a.n, a.n, h, w, c).transpose(0, 2, 1, 3, 4).reshape(a.n * h, a.n * w, c)
Image.fromarray(grid[..., 0] if c == 1 else grid).save(a.out)
print(f"wrote {a.out} ({a.n}×{a.n} samples, DDIM {a.steps} steps, seed {a.seed})")
