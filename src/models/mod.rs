//! Denoisers, their training and their checkpoints: the 8×8 toys and the diffusers
//! `UNet2DModel`, over the shared DP-SGD step, card and canaries.
//!
//! * [`toy`]: the 8×8 MLP/UNet, their training (plain and RAPID's DP-SGD) and checkpoints.
//! * [`unet2d`]: the diffusers `UNet2DModel` — its config, the typed graph every executor walks
//!   (the only producer of diffusers tensor names), its weights, and the executors: candle
//!   inference, the CPU forward, the CUDA forward, the candle trainer with batched per-sample
//!   gradients and the hand-written CPU per-sample gradients.
//! * [`diffusers`]: HuggingFace diffusers checkpoint folders (any image size and channel count);
//!   their `scheduler_config.json` is read in [`crate::diffusion::schedule::diffusers`].
//! * [`train`]: the one training orchestrator of both families — the plan, the DP-SGD step
//!   (Poisson sampling, clipping, noise, the ledger), Adam and the weight average, periodic
//!   checkpoints and the output set (weights, card, ledger, canaries) — with what differs
//!   (per-sample gradients, the card, the weights file) behind its `Family` trait.
//! * [`diffusers_train`]: the diffusers family of `dpaudit train --unet` (presets, the card,
//!   the gradient paths) and its setup.
//! * [`dp`]: the DP-SGD primitives (CSPRNG, the released noisy update, the ledger file).
//! * [`card`]: what a card records (data, split, training, DP, canaries) and its paths.
//! * [`canary`]: canaries for the one-run audits (input and white-box gradient canaries).
//! * [`device`]: `--device auto|cpu|cuda`.
//! * [`folder`]: the file names of a diffusers folder as dpaudit writes it, where its UNet,
//!   scheduler config and ledger sit, and the card's randomness texts (no tensors).
//! * [`precision`]: `--precision fp32|tf32|bf16` of the UNet forward on a GPU (cuDNN
//!   convolutions with an explicit math type in `unet2d::cuda::cudnn_conv`, feature `cudnn`).
//!
//! Data sets are in [`crate::data`], noise schedules in [`crate::diffusion::schedule`].
//!
//! The CPU kernels (`unet2d/cpu/kernels.rs`) and the CUDA code (`unet2d/cuda/`: the forward, its
//! `.cu`, cuDNN and the algorithm record) live under [`unet2d`]; `unsafe` appears only there
//! (and in [`device`]'s CUDA memory-pool set-up).

// Without the `models` feature (the Python extension's build) only the candle-free modules
// compile: what a card records and the diffusers folder's file names, which the accounting
// chain and the reports use.
#[cfg(feature = "models")]
pub mod canary;
pub mod card;
#[cfg(feature = "models")]
pub mod device;
#[cfg(feature = "models")]
pub mod diffusers;
#[cfg(feature = "models")]
pub mod diffusers_train;
#[cfg(feature = "models")]
pub mod dp;
pub mod folder;
/// `--precision` lives with the UNet it applies to; re-exported here for its callers outside
/// `models/`.
#[cfg(feature = "models")]
pub use unet2d::precision;
#[cfg(feature = "models")]
pub mod toy;
#[cfg(feature = "models")]
pub mod train;
#[cfg(feature = "models")]
pub mod unet2d;

#[cfg(feature = "models")]
pub use device::DeviceChoice;
