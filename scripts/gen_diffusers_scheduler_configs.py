"""Writes the scheduler configs a diffusers user holds, as diffusers' own `save_pretrained` writes
them, into fixtures/samplers/diffusers/sd15-<name>-scheduler_config.json.

Five classes with Stable Diffusion v1.5's training schedule (scaled_linear β 0.00085..0.012 over
1000 steps, steps_offset 1, as the v1.5 model's shipped PNDMScheduler config states): DDPM, DDIM,
Euler (EulerDiscreteScheduler), DPM-Solver++ (DPMSolverMultistepScheduler, whose saved config holds
`-Infinity` for lambda_min_clipped) and PNDM. Each file is `from_config` of that dict followed by
`save_pretrained`, byte for byte what diffusers writes (tool and version are recorded in the
`_diffusers_version` key diffusers adds).

    python scripts/gen_diffusers_scheduler_configs.py      # needs `pip install diffusers`
"""
import pathlib
import shutil
import tempfile

import diffusers

SD15 = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "steps_offset": 1,
    "clip_sample": False,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
}

CLASSES = {
    "ddpm": diffusers.DDPMScheduler,
    "ddim": diffusers.DDIMScheduler,
    "euler": diffusers.EulerDiscreteScheduler,
    "dpmsolver": diffusers.DPMSolverMultistepScheduler,
    "pndm": diffusers.PNDMScheduler,
}


def main():
    out = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "samplers" / "diffusers"
    out.mkdir(parents=True, exist_ok=True)
    for name, cls in CLASSES.items():
        sched = cls.from_config(SD15)
        with tempfile.TemporaryDirectory() as d:
            sched.save_pretrained(d)
            dst = out / f"sd15-{name}-scheduler_config.json"
            shutil.copyfile(pathlib.Path(d) / "scheduler_config.json", dst)
            print(f"{dst} ({cls.__name__}, diffusers {diffusers.__version__})")


if __name__ == "__main__":
    main()
