//! Small ε-prediction denoisers for 8×8 images (candle), their training (plain and DP), and
//! checkpoints.
//!
//! * [`net`]: an MLP with a sinusoidal time embedding and a small UNet, with deterministic
//!   (seeded) initialisation.
//! * [`schedule`]: the DDPM linear β schedule (Ho et al. 2020, §4: β₁ = 1e-4 … β_T = 0.02).
//! * [`data`]: the digits data set and member/non-member/public split manifests (disjoint,
//!   hashed).
//! * [`train`]: DDPM training with Adam and EMA weights.
//! * [`dp`]: DP-SGD as in RAPID's Algorithm 2 (Poisson sampling, per-sample clipping, Gaussian
//!   noise, Adam) and RAPID's retrieval variant; every run records its [`crate::events::DpEvent`].
//! * [`run`]: a whole `dpaudit train` run as one library call (plan → checkpoint, card, ledger).
//! * [`checkpoint`]: safetensors weights plus a TOML card (data and split hashes, seed, command).
//! * [`device`]: `--device auto|cpu|cuda`.
//! * [`unet2d`]: the diffusers `UNet2DModel` — its config, the typed graph every executor walks
//!   (the only producer of diffusers tensor names), its weights, and the executors: candle
//!   inference, the CPU forward, the CUDA forward, the candle trainer with batched per-sample
//!   gradients and the hand-written CPU per-sample gradients.
//! * [`diffusers`], [`scheduler`]: HuggingFace diffusers checkpoint folders and
//!   `scheduler_config.json` files (any image size and channel count).
//! * [`diffusers_train`]: `dpaudit train --unet` (plain or DP-SGD as Opacus runs it).
//! * [`images`]: image data sets (the shipped MNIST digits, PNG folders, `.npy` arrays) and
//!   their member/non-member splits; [`npy`]: `.npy` reading and writing.
//! * [`folder`]: the file names of a diffusers folder as dpaudit writes it, where its UNet,
//!   scheduler config and ledger sit, and the card's randomness texts (no tensors).
//! * [`precision`]: `--precision fp32|tf32|bf16` of the UNet forward on a GPU (cuDNN
//!   convolutions with an explicit math type in `unet2d::cuda::cudnn_conv`, feature `cudnn`).
//!
//! The CPU kernels (`unet2d/cpu/kernels.rs`) and the CUDA code (`unet2d/cuda/`: the forward, its
//! `.cu`, cuDNN and the algorithm record) live under [`unet2d`]; `unsafe` appears only there
//! (and in [`device`]'s CUDA memory-pool set-up).

// Without the `models` feature (the Python extension's build) only the candle-free modules
// compile: data sets, `.npy`, the schedule, the diffusers folder's file names and the card's
// randomness texts, which the accounting chain and the reports use.
#[cfg(feature = "models")]
pub mod canary;
#[cfg(feature = "models")]
pub mod checkpoint;
pub mod data;
#[cfg(feature = "models")]
pub mod device;
#[cfg(feature = "models")]
pub mod diffusers;
#[cfg(feature = "models")]
pub mod diffusers_train;
#[cfg(feature = "models")]
pub mod dp;
pub mod folder;
pub mod images;
#[cfg(feature = "models")]
pub mod net;
pub mod npy;
/// `--precision` lives with the UNet it applies to; re-exported here for its callers outside
/// `models/`.
#[cfg(feature = "models")]
pub use unet2d::precision;
#[cfg(feature = "models")]
pub mod run;
pub mod schedule;
/// diffusers `scheduler_config.json` files are read in [`crate::diffusion::scheduler`].
pub use crate::diffusion::scheduler;
#[cfg(feature = "models")]
pub mod train;
#[cfg(feature = "models")]
pub mod unet2d;

#[cfg(feature = "models")]
pub use checkpoint::{Card, Checkpoint};
pub use data::{Dataset, SplitManifest};
#[cfg(feature = "models")]
pub use device::DeviceChoice;
#[cfg(feature = "models")]
pub use net::{Arch, ModelConfig, Net};
pub use schedule::Schedule;

/// Number of pixels of one image (8×8).
pub const PIXELS: usize = 64;
/// Side of one image.
pub const SIDE: usize = 8;
