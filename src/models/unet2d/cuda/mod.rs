//! The CUDA side of the UNet: the forward executor of the [`super::Graph`] (`forward`, its
//! kernels in `kernels.cu`, compiled to PTX by build.rs), the cuDNN convolutions
//! ([`cudnn_conv`]) and the per-machine record of cuDNN's algorithm choices ([`algo_record`]).
//! Everything but the record needs the `cudnn` feature; every `unsafe` block of the CUDA side is
//! here, each with its `// SAFETY:` invariant.

pub mod algo_record;
#[cfg(feature = "cudnn")]
pub mod cudnn_conv;
#[cfg(feature = "cudnn")]
mod forward;

#[cfg(feature = "cudnn")]
pub(super) use forward::{disabled, CudaUnet};
