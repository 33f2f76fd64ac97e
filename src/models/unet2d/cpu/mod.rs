//! The CPU executors of the [`super::Graph`] and their kernels.
//!
//! * [`kernels`]: GEMM, the direct 3 × 3 convolution, exp/SiLU, the attention kernels (every
//!   `unsafe` block of the CPU side, each with its `// SAFETY:` invariant).
//! * `forward`: the batch-parallel inference forward ([`super::Unet2dModel`] on the host).
//! * [`grad`]: the per-sample gradients of one sample at a time (the graph walked forward, then
//!   backward, one gradient function per primitive op kind).

mod forward;
pub mod grad;
pub mod kernels;

pub(super) use forward::{im2col_plane, CpuUnet};
