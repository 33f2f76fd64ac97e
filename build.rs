//! With the `cudnn` feature, compiles the CUDA UNet forward's kernels
//! (`src/models/unet2d/cuda/kernels.cu`) to PTX with nvcc (`NVCC` or `nvcc` on `PATH`) for
//! `CUDA_COMPUTE_CAP` (default 90); without it, does nothing.
use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/models/unet2d/cuda/kernels.cu");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=NVCC");
    if env::var_os("CARGO_FEATURE_CUDNN").is_none() {
        return;
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("unet2d_cuda.ptx");
    let cap = env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let nvcc = env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let status = Command::new(&nvcc)
        .args([
            "--ptx",
            "-O3",
            &format!("-arch=compute_{cap}"),
            "src/models/unet2d/cuda/kernels.cu",
            "-o",
        ])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{nvcc} failed on src/models/unet2d/cuda/kernels.cu ({s})"),
        Err(e) => panic!("cannot run {nvcc} (needed by the `cudnn` feature): {e}"),
    }
}
