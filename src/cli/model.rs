//! `dpaudit model eval|info`: run a diffusers checkpoint on a batch (to check against PyTorch
//! that it was loaded right) and describe it.

use std::path::PathBuf;

use crate::cli::values::DeviceChoice;
use dpaudit::error::Error;
use dpaudit::models::diffusers::DiffusersCheckpoint;
use dpaudit::models::{device, npy};

const EXAMPLES: &str = "\
Examples:
  dpaudit model info fixtures/diffusers/unet-28-c1-attn
  dpaudit model eval --checkpoint fixtures/diffusers/unet-28-c1-attn \\
      --input fixtures/diffusers/unet-28-c1-attn/input.npy \\
      --timesteps fixtures/diffusers/unet-28-c1-attn/timesteps.npy --out pred.npy

The checkpoint is a diffusers folder (config.json + diffusion_pytorch_model.safetensors, as
UNet2DModel.save_pretrained writes it) or a pipeline folder with unet/. The output is the raw
model output (ε, v or x₀ as the scheduler's prediction_type says), float32 (B, C, H, W).

Exit codes: 0 ok; 2 bad input (a bad checkpoint names the file and the tensor).";

/// `dpaudit model` arguments.
#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    #[command(subcommand)]
    cmd: Sub,
}

#[derive(Debug, clap::Subcommand)]
enum Sub {
    /// Run the UNet on a float32 batch (B, C, H, W) at int64 timesteps (B,); write float32.
    Eval(EvalArgs),
    /// Architecture, parameter count, file hashes and scheduler of a checkpoint.
    Info(InfoArgs),
}

#[derive(Debug, clap::Args)]
struct EvalArgs {
    /// diffusers checkpoint folder.
    #[arg(long)]
    checkpoint: PathBuf,
    /// float32 .npy of shape (B, C, H, W).
    #[arg(long)]
    input: PathBuf,
    /// int64 (or int32, or float32 for Fourier-time models) .npy of shape (B,).
    #[arg(long)]
    timesteps: PathBuf,
    /// Output .npy (float32, (B, C_out, H, W)).
    #[arg(long)]
    out: PathBuf,
    /// Replace an existing --out file (without it, an existing file is refused before any work).
    #[arg(long)]
    force: bool,
    /// Images per forward pass.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceChoice,
}

#[derive(Debug, clap::Args)]
struct InfoArgs {
    /// diffusers checkpoint folder.
    checkpoint: PathBuf,
}

/// Runs `dpaudit model …`.
pub fn run(a: Args) -> anyhow::Result<dpaudit::audit::outcome::Status> {
    match a.cmd {
        Sub::Info(i) => {
            let ck = DiffusersCheckpoint::load(&i.checkpoint, &candle_core::Device::Cpu)?;
            print!("{}", ck.info());
            Ok(dpaudit::audit::outcome::Status::Ok)
        }
        Sub::Eval(e) => {
            if e.batch == 0 {
                return Err(Error::field("--batch", "must be ≥ 1").into());
            }
            dpaudit::report::output::check_file(&e.out, e.force).map_err(|err| err.with_field("--out"))?;
            let dev = device::select(e.device.into())?;
            let ck = DiffusersCheckpoint::load(&e.checkpoint, &dev)?;
            let x = npy::read(&e.input)?;
            let xs = x.to_f32().ok_or_else(|| {
                Error::input(format!("element type {} (expected float32 <f4)", x.dtype.descr())).with_file(&e.input)
            })?;
            if x.shape.len() != 4 {
                return Err(Error::input(format!("shape {:?}, expected (B, C, H, W)", x.shape))
                    .with_file(&e.input)
                    .into());
            }
            let t = npy::read(&e.timesteps)?;
            let ts: Vec<f64> = match (t.to_i64(), t.to_f32()) {
                (Some(v), _) => {
                    if let Some(bad) = v.iter().find(|&&s| s < 0) {
                        return Err(Error::input(format!("negative timestep {bad}"))
                            .with_file(&e.timesteps)
                            .into());
                    }
                    v.iter().map(|&s| s as f64).collect()
                }
                (None, Some(v)) => v.iter().map(|&s| s as f64).collect(),
                _ => {
                    return Err(
                        Error::input(format!("element type {} (expected int64 <i8)", t.dtype.descr()))
                            .with_file(&e.timesteps)
                            .into(),
                    )
                }
            };
            if t.shape != [x.shape[0]] {
                return Err(Error::input(format!(
                    "shape {:?}, expected ({},) — one timestep per input image",
                    t.shape, x.shape[0]
                ))
                .with_file(&e.timesteps)
                .into());
            }
            let shape = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
            let y = ck
                .eval(&xs, shape, &ts, e.batch)
                .map_err(|err| err.with_file(&e.input))?;
            let out_shape = [shape[0], ck.model.config.out_channels, shape[2], shape[3]];
            dpaudit::report::output::write_atomic(&e.out, &npy::encode_f32(&out_shape, &y), e.force)?;
            eprintln!(
                "wrote {} ({}×{}×{}×{} float32)",
                e.out.display(),
                out_shape[0],
                out_shape[1],
                out_shape[2],
                out_shape[3]
            );
            Ok(dpaudit::audit::outcome::Status::Ok)
        }
    }
}
