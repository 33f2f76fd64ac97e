"""Builds small diffusers UNet2DModels of several architectures, saves them with save_pretrained
and writes reference predictions, as the fixtures that `dpaudit model eval` must reproduce
(tests/integration/diffusers.rs). Run outside CI:

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch diffusers safetensors numpy
    /tmp/venv/bin/python scripts/make_diffusers_fixtures.py fixtures/diffusers

Each fixture folder holds config.json, diffusion_pytorch_model.safetensors,
scheduler_config.json, input.npy (float32 (B, C, H, W)), timesteps.npy (int64 (B,)) and
expected.npy (float32: the model output computed by diffusers in float32 on the CPU).
Every parameter is perturbed with seeded noise after construction, so that group-norm scales,
biases and zero-initialised layers all take distinct values and a mis-wired tensor shows.
"""
import json
import os
import sys

import numpy as np
import torch
from diffusers import DDIMScheduler, DDPMScheduler, UNet2DModel

MODELS = {
    # 1 channel, 28 px, attention in the second level and the mid block; linear β, ε.
    "unet-28-c1-attn": dict(
        model=dict(
            sample_size=28, in_channels=1, out_channels=1, block_out_channels=(16, 24), layers_per_block=1,
            down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
            norm_num_groups=8, attention_head_dim=8,
        ),
        scheduler=("DDPM", dict(num_train_timesteps=1000, beta_schedule="linear", prediction_type="epsilon")),
    ),
    # 3 channels, 32 px, no attention anywhere, scale-shift time conditioning, sin before cos,
    # freq_shift 1, asymmetric down padding; cosine β, v-prediction (DDIM).
    "unet-32-c3-noattn": dict(
        model=dict(
            sample_size=32, in_channels=3, out_channels=3, block_out_channels=(8, 16, 24), layers_per_block=1,
            down_block_types=("DownBlock2D",) * 3, up_block_types=("UpBlock2D",) * 3, add_attention=False,
            resnet_time_scale_shift="scale_shift", flip_sin_to_cos=False, freq_shift=1, norm_num_groups=8,
            downsample_padding=0,
        ),
        scheduler=("DDIM", dict(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2",
                                prediction_type="v_prediction", timestep_spacing="trailing")),
    ),
    # 1 channel, 28 px, Fourier time embedding, one head per attention, ResNet down/upsampling,
    # 2 layers per block, mish, mid-block scale factor, eps 1e-6; x0-prediction.
    "unet-28-c1-fourier": dict(
        model=dict(
            sample_size=28, in_channels=1, out_channels=1, block_out_channels=(8, 16), layers_per_block=2,
            down_block_types=("AttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "AttnUpBlock2D"),
            time_embedding_type="fourier", attention_head_dim=None, downsample_type="resnet",
            upsample_type="resnet", act_fn="mish", mid_block_scale_factor=1.414, norm_eps=1e-6,
            norm_num_groups=4, center_input_sample=True,
        ),
        scheduler=("DDPM", dict(num_train_timesteps=1000, beta_schedule="scaled_linear", beta_start=0.00085,
                                beta_end=0.012, prediction_type="sample")),
    ),
    # 3 channels, 32 px, attention everywhere with 2 and 3 heads, scale-shift conditioning (so the mid
    # attention has no group norm, as diffusers builds it); linear β, ε.
    "unet-32-c3-attn": dict(
        model=dict(
            sample_size=32, in_channels=3, out_channels=3, block_out_channels=(16, 24), layers_per_block=1,
            down_block_types=("AttnDownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "AttnUpBlock2D"), attention_head_dim=8, norm_num_groups=8,
            resnet_time_scale_shift="scale_shift",
        ),
        scheduler=("DDPM", dict(num_train_timesteps=1000, beta_schedule="linear", prediction_type="epsilon")),
    ),
}


def build(name, spec, out_root, seed):
    torch.manual_seed(seed)
    model = UNet2DModel(**spec["model"]).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    d = os.path.join(out_root, name)
    model.save_pretrained(d, safe_serialization=True)
    kind, sargs = spec["scheduler"]
    (DDPMScheduler if kind == "DDPM" else DDIMScheduler)(**sargs).save_pretrained(d)
    c = spec["model"]["in_channels"]
    s = spec["model"]["sample_size"]
    b = 3
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(b, c, s, s, generator=g)
    t = torch.randint(1, 1000, (b,), generator=g, dtype=torch.int64)
    with torch.no_grad():
        y = model(x, t).sample
        # Round trip: the saved folder loads in diffusers and gives the same output.
        y2 = UNet2DModel.from_pretrained(d).eval()(x, t).sample
    assert torch.equal(y, y2), name
    np.save(os.path.join(d, "input.npy"), x.numpy().astype(np.float32))
    np.save(os.path.join(d, "timesteps.npy"), t.numpy().astype(np.int64))
    np.save(os.path.join(d, "expected.npy"), y.numpy().astype(np.float32))
    n = sum(p.numel() for p in model.parameters())
    size = os.path.getsize(os.path.join(d, "diffusion_pytorch_model.safetensors"))
    print(f"{name}: {n} parameters, {size} bytes, output |y| max {y.abs().max().item():.3f}")
    return n


def main():
    out_root = sys.argv[1] if len(sys.argv) > 1 else "fixtures/diffusers"
    os.makedirs(out_root, exist_ok=True)
    import diffusers
    meta = {"diffusers": diffusers.__version__, "torch": torch.__version__, "models": {}}
    for i, (name, spec) in enumerate(MODELS.items()):
        meta["models"][name] = build(name, spec, out_root, seed=100 + i)
    with open(os.path.join(out_root, "versions.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
