//! `--device auto|cpu|cuda`.
//!
//! `auto` uses CUDA device 0 when dpaudit was built with the `cuda` cargo feature and a GPU is
//! present, else the CPU; `cuda` fails (exit 2) when either is missing. Callers print
//! [`describe`] so a run always says which device it used.

use candle_core::Device;

use crate::error::{Error, Result};

/// The `--device` flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
                let d = Device::cuda_if_available(0).unwrap_or(Device::Cpu);
                prepare_cuda(&d);
                Ok(d)
            }
            #[cfg(not(feature = "cuda"))]
            {
                Ok(Device::Cpu)
            }
        }
        DeviceChoice::Cuda => {
            #[cfg(feature = "cuda")]
            {
                let d = Device::new_cuda(0).map_err(|e| Error::field("--device", cuda_open_error(&e.to_string())))?;
                prepare_cuda(&d);
                Ok(d)
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

/// Two of CUDA's defaults that cost time in dpaudit's use of a GPU, changed once when the device
/// is opened (before any weight is loaded):
///
/// * cudarc's per-buffer CUDA events: with candle's own (non-default) stream every buffer gets
///   two events, created and destroyed with it and recorded or waited on at each use, to order
///   uses across streams. dpaudit issues all GPU work on that one stream (candle's ops, cuDNN,
///   cuBLAS, the CUDA UNet forward: every `cuda_stream()`), where stream order already orders
///   every use and every stream-ordered free, so they are turned off.
/// * the stream-ordered pool's release threshold: 0 by default, so each synchronisation (a copy
///   back to the host) returns the pool's free memory to the driver and the next forward maps it
///   again. It is raised to "never" for this process, as PyTorch's caching allocator keeps its
///   blocks; the memory is freed when the process ends.
///
/// Failures are ignored: both are speed settings, not results.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
fn prepare_cuda(device: &Device) {
    use candle_core::cuda::cudarc::driver::sys;
    let Device::Cuda(d) = device else { return };
    // SAFETY: see above: one stream per device, so no use needs cross-stream ordering.
    unsafe { d.disable_event_tracking() };
    let ctx = d.cuda_stream().context().clone();
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer; the device handle is the context's own.
    let got = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) };
    if got == sys::CUresult::CUDA_SUCCESS && !pool.is_null() {
        let mut keep = u64::MAX;
        // SAFETY: RELEASE_THRESHOLD takes a pointer to a cuuint64_t.
        let _ = unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
        };
    }
}

/// The message for a CUDA device that cannot be opened: the first line of candle's error (its
/// backtrace dropped), with the usual cause spelled out.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn cuda_open_error(candle_message: &str) -> String {
    let first = candle_message.lines().next().unwrap_or("").trim();
    let hint = if first.contains("CUDA_ERROR_STUB_LIBRARY") || first.contains("CUDA_ERROR_NO_DEVICE") {
        "no NVIDIA driver or GPU on this machine; use --device cpu or auto"
    } else {
        "check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES, or use --device cpu"
    };
    format!("cannot open CUDA device 0 ({first}): {hint}")
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
    fn cpu_always_works() {
        let d = select(DeviceChoice::Cpu).unwrap();
        assert!(d.is_cpu());
        assert!(describe(&d).starts_with("cpu ("));
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_the_feature_auto_is_cpu_and_cuda_is_refused() {
        assert!(select(DeviceChoice::Auto).unwrap().is_cpu());
        let e = select(DeviceChoice::Cuda).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("--device"));
        assert!(e.to_string().contains("built without the `cuda` feature"), "{e}");
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn with_the_feature_cuda_opens_a_gpu_or_fails_cleanly() {
        match select(DeviceChoice::Cuda) {
            Ok(d) => {
                assert!(d.is_cuda());
                assert_eq!(describe(&d), "cuda:0");
                assert!(select(DeviceChoice::Auto).unwrap().is_cuda());
            }
            Err(e) => {
                assert_eq!(e.field.as_deref(), Some("--device"));
                assert!(!e.to_string().contains("backtrace"), "{e}");
                assert!(select(DeviceChoice::Auto).unwrap().is_cpu());
            }
        }
    }

    #[test]
    fn cuda_errors_drop_candle_backtraces() {
        let m = cuda_open_error("DriverError(CUDA_ERROR_STUB_LIBRARY, \"x\")\n   0: candle_core::error::Error::bt\n");
        assert!(!m.contains("candle_core::error"), "{m}");
        assert!(
            m.contains("CUDA_ERROR_STUB_LIBRARY") && m.contains("--device cpu"),
            "{m}"
        );
    }
}
