//! `mia` flags that state how a checkpoint trained outside dpaudit was trained: `--ledger FILE`
//! or Opacus-style settings (see [`dpaudit::attacks::mechanism`]).

use std::path::PathBuf;

use dpaudit::attacks::mechanism::OpacusSpec;

/// The training mechanism of a diffusers checkpoint without a dpaudit ledger.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct MechanismArgs {
    /// Diffusers checkpoints: the training mechanism as an event or ledger TOML (e.g. the
    /// `dpaudit-ledger.toml` of another run, or one written for an Opacus run); every attack is
    /// compared with its limit.
    #[arg(long, value_name = "FILE.toml")]
    pub ledger: Option<PathBuf>,
    /// Diffusers checkpoints trained with DP-SGD (Opacus-style statement): noise multiplier σ.
    #[arg(long, value_name = "SIGMA")]
    pub noise_multiplier: Option<f64>,
    /// Opacus-style: Poisson sampling rate q.
    #[arg(long, value_name = "Q")]
    pub sample_rate: Option<f64>,
    /// Opacus-style: the training batch size B (with --dataset-size N: q = B/N).
    #[arg(long, value_name = "B")]
    pub train_batch_size: Option<u64>,
    /// Opacus-style: the training data set size N.
    #[arg(long, value_name = "N")]
    pub dataset_size: Option<u64>,
    /// Opacus-style: optimiser steps.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Opacus-style: epochs (⌈N/B⌉ or ⌈1/q⌉ steps each, as Opacus' Poisson loader runs them).
    #[arg(long)]
    pub epochs: Option<u64>,
    /// Diffusers folders: the folder's release must be signed (`train --unet --sign-key`) by
    /// one of these Ed25519 public keys (repeatable); without it a signature is checked for
    /// integrity only and the report says whether the ledger is signed, and by whom.
    #[arg(long, value_name = "PUBKEY")]
    pub trust_key: Vec<PathBuf>,
}

impl MechanismArgs {
    /// The Opacus-style part.
    pub fn spec(&self) -> OpacusSpec {
        OpacusSpec {
            noise_multiplier: self.noise_multiplier,
            sample_rate: self.sample_rate,
            batch_size: self.train_batch_size,
            dataset_size: self.dataset_size,
            steps: self.steps,
            epochs: self.epochs,
        }
    }
}
