//! `dpaudit train --unet CONFIG|PRESET`: arguments → [`Plan`] →
//! [`dpaudit::audit::train::execute`]. The run (DP-SGD with batched per-sample
//! gradients, the diffusers folder, card and ledger) lives in the library.

use std::path::{Path, PathBuf};

use crate::cli::train::{schedule_config, train_plan, Args};
use crate::cli::values::PerSample;
use dpaudit::audit::train::{Model, Plan, UnetPlan};
use dpaudit::error::Error;

/// The MNIST digits shipped for diffusers models (used when --data/--split keep the 8×8 defaults).
const MNIST_DATA: &str = "fixtures/data/mnist/mnist-10k.u8.gz";
const MNIST_SPLIT: &str = "fixtures/splits/mnist.toml";

/// `--data` / `--split` of a `train --unet` run: they default to the 8×8 digits; a UNet takes
/// images, so the defaults become the shipped MNIST.
pub fn data_and_split(a: &Args) -> (PathBuf, PathBuf) {
    if a.data == Path::new("fixtures/data/digits.csv.gz") && a.split == Path::new("fixtures/splits/digits.toml") {
        (PathBuf::from(MNIST_DATA), PathBuf::from(MNIST_SPLIT))
    } else {
        (a.data.clone(), a.split.clone())
    }
}

/// Runs `train --unet`; `outputs` are the prepared `--format` outputs of `train`.
pub fn run(
    a: Args,
    unet: &std::ffi::OsStr,
    outputs: crate::cli::common::Outputs,
) -> anyhow::Result<dpaudit::audit::outcome::Verdict> {
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
    // The signing key is read, the --init folder's signature checked against the trusted keys,
    // and existing outputs refused, before any work.
    let sign_key = dpaudit::audit::train::prepare_unet(&dpaudit::audit::train::UnetPreflight {
        sign_key: a.sign_key.as_deref(),
        trust_key: &a.trust_key,
        init: a.init.as_deref(),
        out: &out,
        dp: a.dp,
        input_canaries,
        gradient_canaries,
        checkpoint_every: a.checkpoint_every,
        force: a.force,
    })?;
    let plan = Plan {
        train: train_plan(
            &a,
            data_and_split(&a),
            out,
            (input_canaries, gradient_canaries),
            sign_key,
        ),
        model: Model::Unet(UnetPlan {
            unet: unet.to_os_string(),
            schedule: schedule_config(&a),
        }),
    };
    Ok(outputs.emit(dpaudit::audit::train::execute(&plan)?)?)
}
