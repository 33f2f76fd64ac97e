//! `--device auto|cpu|cuda`.
//!
//! `auto` uses CUDA device 0 when dpaudit was built with the `cuda` cargo feature and a GPU is
//! present, else the CPU; `cuda` fails (exit 2) when either is missing. Callers print
//! [`describe`] so a run always says which device it used.

use candle_core::Device;

use crate::error::{Error, Result};

/// The `--device` flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DeviceChoice {
    #[default]
    /// CUDA when built with it and a GPU is present, else CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// GPU 0 (needs the `cuda` feature).
    Cuda,
}

/// Picks the device for `choice`.
pub fn select(choice: DeviceChoice) -> Result<Device> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Auto => {
            #[cfg(feature = "cuda")]
            {
                Ok(Device::cuda_if_available(0).unwrap_or(Device::Cpu))
            }
            #[cfg(not(feature = "cuda"))]
            {
                Ok(Device::Cpu)
            }
        }
        DeviceChoice::Cuda => {
            #[cfg(feature = "cuda")]
            {
                Device::new_cuda(0).map_err(|e| Error::field("--device", format!("cannot open CUDA device 0: {e}")))
            }
            #[cfg(not(feature = "cuda"))]
            {
                Err(Error::field(
                    "--device",
                    "this dpaudit was built without the `cuda` feature (rebuild with `cargo build --release --features cuda`), or use --device cpu/auto",
                ))
            }
        }
    }
}

/// A short description: "cpu" or "cuda:0".
pub fn describe(device: &Device) -> String {
    match device {
        Device::Cpu => format!("cpu ({} threads)", rayon::current_num_threads()),
        Device::Cuda(_) => "cuda:0".to_string(),
        Device::Metal(_) => "metal".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_always_works_and_auto_falls_back() {
        assert!(select(DeviceChoice::Cpu).unwrap().is_cpu());
        let d = select(DeviceChoice::Auto).unwrap();
        #[cfg(not(feature = "cuda"))]
        assert!(d.is_cpu());
        let _ = describe(&d);
        #[cfg(not(feature = "cuda"))]
        assert_eq!(
            select(DeviceChoice::Cuda).unwrap_err().field.as_deref(),
            Some("--device")
        );
    }
}
