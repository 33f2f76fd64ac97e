//! `dpaudit train --unet CONFIG|PRESET`: arguments → [`UnetTrainPlan`] →
//! [`dpaudit::models::diffusers_train::run`]. The run (DP-SGD with batched per-sample
//! gradients, the diffusers folder, card and ledger) lives in the library.

use std::path::{Path, PathBuf};

use crate::cli::train::Args;
use crate::cli::values::PerSample;
use dpaudit::error::Error;
use dpaudit::models::device;
use dpaudit::models::diffusers_train::{self, UnetDpPlan, UnetTrainPlan};

/// The MNIST digits shipped for diffusers models (used when --data/--split keep the 8×8 defaults).
const MNIST_DATA: &str = "fixtures/data/mnist/mnist-10k.u8.gz";
const MNIST_SPLIT: &str = "fixtures/splits/mnist.toml";

/// Runs `train --unet`; `outputs` are the prepared `--format` outputs of `train`.
pub fn run(
    a: Args,
    unet: &std::ffi::OsStr,
    outputs: crate::cli::common::Outputs,
) -> anyhow::Result<dpaudit::audit::outcome::Status> {
    if a.rapid {
        return Err(Error::field("--rapid", "RAPID is for the 8×8 models; not with --unet").into());
    }
    if matches!(a.per_sample, PerSample::Ghost) {
        return Err(Error::field(
            "--per-sample",
            "with --unet: auto (one batched pass) or loop (one backward pass per sample)",
        )
        .into());
    }
    use crate::cli::train::CanaryKindArg;
    let (input_canaries, gradient_canaries) = match a.canary_kind {
        CanaryKindArg::Input => (a.canaries, 0),
        CanaryKindArg::Gradient => (0, a.canaries),
        CanaryKindArg::Both => (a.canaries, a.gradient_canaries.unwrap_or(a.canaries)),
    };
    if a.gradient_canaries.is_some() && !matches!(a.canary_kind, CanaryKindArg::Both) {
        return Err(Error::field(
            "--gradient-canaries",
            "sets the gradient canaries of --canary-kind both (with one kind, --canaries is the count)",
        )
        .into());
    }
    let gradient = gradient_canaries > 0;
    if gradient && !a.dp {
        return Err(Error::field(
            "--canary-kind",
            "gradient canaries are observed in DP-SGD's noisy updates: train with --dp (or use --canary-kind input)",
        )
        .into());
    }
    let Some(out) = a.out.clone() else {
        return Err(Error::field("--out", "give an output folder, e.g. --out models/mnist-dp-ddpm").into());
    };
    // The signing key is read, and the --init folder's signature checked against the trusted
    // keys, before any work.
    let sign_key = match &a.sign_key {
        Some(p) => Some(dpaudit::provenance::load_secret(p).map_err(|e| e.with_field("--sign-key"))?),
        None => None,
    };
    let trusted = dpaudit::provenance::load_trusted(&a.trust_key)?;
    if let (Some(init), false) = (&a.init, trusted.is_empty()) {
        let dir = dpaudit::models::folder::unet_dir(init).unwrap_or_else(|| init.clone());
        let st = dpaudit::provenance::verify_folder(&dir, &diffusers_train::RELEASED, &trusted)?;
        dpaudit::report::progress::note(&format!("--init {}: {}", dir.display(), st.describe()));
    }
    // Existing outputs are refused before any work, and so is a symbolic link at an output
    // folder (it would send the set, with --force its replacements, elsewhere).
    dpaudit::report::output::refuse_link(&out)?;
    for f in diffusers_train::output_files(a.dp, input_canaries > 0, gradient, input_canaries > 0 && gradient) {
        dpaudit::report::output::check_file(&out.join(f), a.force)?;
    }
    if sign_key.is_some() {
        dpaudit::report::output::check_file(&out.join(dpaudit::provenance::SIGNATURE), a.force)?;
    }
    match a.checkpoint_every {
        Some(0) => return Err(Error::field("--checkpoint-every", "must be ≥ 1").into()),
        Some(_) => {
            let dir = out.join(diffusers_train::CHECKPOINT_DIR);
            dpaudit::report::output::refuse_link(&dir)?;
            // The folder itself appears only with the first checkpoint, whole (one rename).
            if dir.is_dir() {
                for f in
                    diffusers_train::output_files(a.dp, input_canaries > 0, gradient, input_canaries > 0 && gradient)
                {
                    dpaudit::report::output::check_file(&dir.join(f), a.force)?;
                }
            }
        }
        None => {}
    }
    // --data / --split default to the 8×8 digits; a UNet takes images: the shipped MNIST.
    let (data, split) =
        if a.data == Path::new("fixtures/data/digits.csv.gz") && a.split == Path::new("fixtures/splits/digits.toml") {
            (PathBuf::from(MNIST_DATA), PathBuf::from(MNIST_SPLIT))
        } else {
            (a.data.clone(), a.split.clone())
        };
    let dev = device::select(a.device.into())?;
    let dev_name = device::describe(&dev);
    dpaudit::report::progress::note(&format!("device: {dev_name}"));
    let plan = UnetTrainPlan {
        data,
        split,
        on: a.on.into(),
        unet: unet.to_os_string(),
        init: a.init.clone(),
        out,
        timesteps: a.timesteps,
        beta_start: a.beta_start,
        beta_end: a.beta_end,
        steps: a.steps,
        batch_size: a.batch_size,
        lr: a.lr,
        ema: a.ema,
        t_min: a.t_min,
        t_max: a.t_max,
        canaries: input_canaries,
        gradient_canaries,
        seed: a.seed,
        dp: a.dp.then_some(UnetDpPlan {
            noise_multiplier: a.noise_multiplier,
            clip: a.clip,
            sample_rate: a.sample_rate,
            delta: a.delta,
            per_sample_loop: matches!(a.per_sample, PerSample::Loop),
        }),
        command: dpaudit::report::command_line(),
        quiet: a.quiet,
        force: a.force,
        checkpoint_every: a.checkpoint_every,
        sign_key,
    };
    Ok(outputs.emit(dpaudit::audit::train::execute_unet(&plan, &dev, &dev_name)?)?)
}
