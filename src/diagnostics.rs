//! The one module that reads diagnostic switches from the environment: settings that change how
//! the GPU forward of the diffusers UNet is executed or recorded, never what a command computes
//! beyond floating-point rounding, so that a run can be compared against another executor or
//! profiled (docs/models.md, "Diagnostics"). Each is read where the executor asks, through the
//! functions below; a choice that changes a result (`--device`, `--precision`) is a plan field
//! and a flag instead.
//!
//! | variable | effect |
//! |---|---|
//! | `DPAUDIT_UNET_CUDA=candle` | the GPU forward through candle's kernels instead of dpaudit's CUDA forward |
//! | `DPAUDIT_UNET_ATTENTION=gemm` | attention on the GEMM path for every head dimension |
//! | `DPAUDIT_CUDA_GRAPH=1` | replay captured CUDA graphs of the forward |
//! | `DPAUDIT_CUDNN_ALGO` | how cuDNN convolution algorithms are searched (see `unet2d::cuda::algo_record`) |
//! | `DPAUDIT_CUDNN_RECORD` | the file of recorded cuDNN algorithm choices (else `$XDG_CACHE_HOME` or `$HOME/.cache`) |
//!
//! Input limits (`DPAUDIT_MAX_*`), timings (`DPAUDIT_TIMING`, `DPAUDIT_PLD_TIMING`), progress and
//! the transaction tests' fault injection are read by the modules they belong to
//! (docs/reliability.md).

// The GPU executor is compiled with the `cudnn` feature only; the switches stay compiled (and
// type-checked) without it.
#![cfg_attr(not(feature = "cudnn"), allow(dead_code))]

use std::ffi::OsString;

/// `DPAUDIT_UNET_CUDA=candle`: the CUDA forward is turned off (candle's kernels run instead).
pub fn unet_cuda_off() -> bool {
    std::env::var("DPAUDIT_UNET_CUDA").is_ok_and(|v| v == "candle")
}

/// `DPAUDIT_UNET_ATTENTION=gemm`: attention stays on the GEMM path for every head dimension.
pub fn unet_gemm_attention() -> bool {
    std::env::var("DPAUDIT_UNET_ATTENTION").is_ok_and(|v| v == "gemm")
}

/// `DPAUDIT_CUDA_GRAPH=1`: captured CUDA graphs of the forward are replayed.
pub fn cuda_graphs() -> bool {
    std::env::var("DPAUDIT_CUDA_GRAPH").is_ok_and(|v| v == "1")
}

/// `DPAUDIT_CUDNN_ALGO`, as given.
pub fn cudnn_algo() -> Option<String> {
    std::env::var("DPAUDIT_CUDNN_ALGO").ok()
}

/// `DPAUDIT_CUDNN_RECORD`, `XDG_CACHE_HOME` and `HOME`, from which the cuDNN algorithm record's
/// file is found.
pub fn cudnn_record_sources() -> (Option<OsString>, Option<OsString>, Option<OsString>) {
    (
        std::env::var_os("DPAUDIT_CUDNN_RECORD"),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}
