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
  dpaudit model info fixtures/diffusers/unet-28-c1-attn --format json   # the report (facts)
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
    /// Per-sample gradients of the ε-prediction loss on a batch (x_t, t, ε): writes each
    /// sample's gradient norm and, with --clip, the clipped sum DP-SGD adds noise to.
    Grads(GradsArgs),
    /// Write a new Ed25519 key pair for signed provenance (`train --unet --sign-key`,
    /// `--trust-key`): DIR/dpaudit-signing.key (secret, mode 0600) and DIR/dpaudit-signing.pub.
    Keygen(KeygenArgs),
}

#[derive(Debug, clap::Args)]
struct GradsArgs {
    /// diffusers checkpoint folder.
    #[arg(long)]
    checkpoint: PathBuf,
    /// float32 .npy of the noised inputs x_t, shape (B, C, H, W).
    #[arg(long)]
    input: PathBuf,
    /// int64 .npy of shape (B,).
    #[arg(long)]
    timesteps: PathBuf,
    /// float32 .npy of the noise targets ε, shape (B, C, H, W).
    #[arg(long)]
    noise: PathBuf,
    /// Clip norm C: also write clipped_sum.safetensors = Σᵢ min(1, C/(‖gᵢ‖ + 1e-6)) gᵢ.
    #[arg(long)]
    clip: Option<f64>,
    /// Output folder: norms.npy (float32, (B,)) and clipped_sum.safetensors.
    #[arg(long)]
    out: PathBuf,
    /// One backward pass per sample (the reference) instead of the batched pass.
    #[arg(long, conflicts_with = "hand_written")]
    per_sample_loop: bool,
    /// The hand-written CPU pass of one sample at a time (what `train --unet` runs on the CPU)
    /// instead of candle's batched pass.
    #[arg(long)]
    hand_written: bool,
    /// Replace existing outputs.
    #[arg(long)]
    force: bool,
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
    /// The arithmetic of the forward on a GPU (tf32 and bf16 need --device cuda).
    #[arg(long, value_enum, default_value = "fp32")]
    precision: crate::cli::values::Precision,
}

#[derive(Debug, clap::Args)]
struct KeygenArgs {
    /// Folder for the key pair (created when missing; existing key files are never replaced).
    #[arg(long)]
    out: PathBuf,
}

/// `model keygen`: a new key pair, never replacing a key file.
fn keygen(k: KeygenArgs) -> anyhow::Result<dpaudit::audit::outcome::Status> {
    for p in dpaudit::provenance::write_key_pair(&k.out)? {
        eprintln!("wrote {}", p.display());
    }
    Ok(dpaudit::audit::outcome::Status::Ok)
}

#[derive(Debug, clap::Args)]
struct InfoArgs {
    /// diffusers checkpoint folder.
    checkpoint: PathBuf,
    /// Output grammar: --format, --out DIR, --force, -q, -v.
    #[command(flatten)]
    output: crate::cli::common::OutputArgs,
}

/// Runs `dpaudit model …`.
pub fn run(a: Args) -> anyhow::Result<dpaudit::audit::outcome::Status> {
    match a.cmd {
        Sub::Grads(g) => grads(g),
        Sub::Keygen(k) => keygen(k),
        Sub::Info(i) => {
            let out = i.output.prepare(crate::cli::common::Format::Text, &[])?;
            Ok(out.emit(dpaudit::audit::model::info(&i.checkpoint)?)?)
        }
        Sub::Eval(e) => {
            if e.batch == 0 {
                return Err(Error::field("--batch", "must be ≥ 1").into());
            }
            dpaudit::report::output::check_file(&e.out, e.force).map_err(|err| err.with_field("--out"))?;
            let dev = device::select(e.device.into())?;
            let prec = e.precision.into();
            dpaudit::models::precision::check_device(prec, &dev)?;
            dpaudit::models::precision::set(prec);
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
            all_finite(&xs, &e.input)?;
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
                (None, Some(v)) => {
                    all_finite(&v, &e.timesteps)?;
                    v.iter().map(|&s| s as f64).collect()
                }
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

fn f32_batch(p: &std::path::Path) -> anyhow::Result<(Vec<usize>, Vec<f32>)> {
    let x = npy::read(p)?;
    let v = x
        .to_f32()
        .ok_or_else(|| Error::input(format!("element type {} (expected float32 <f4)", x.dtype.descr())).with_file(p))?;
    if x.shape.len() != 4 {
        return Err(Error::input(format!("shape {:?}, expected (B, C, H, W)", x.shape))
            .with_file(p)
            .into());
    }
    all_finite(&v, p)?;
    Ok((x.shape.clone(), v))
}

/// Refuses a batch with a NaN or infinite value, naming the file and the first such element.
fn all_finite(v: &[f32], p: &std::path::Path) -> anyhow::Result<()> {
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        return Err(
            Error::input(format!("element {i} is {}: a model input must be finite", v[i]))
                .with_file(p)
                .into(),
        );
    }
    Ok(())
}

/// `model grads`: per-sample gradients of a diffusers UNet on one batch.
fn grads(g: GradsArgs) -> anyhow::Result<dpaudit::audit::outcome::Status> {
    use dpaudit::models::unet2d::train::{clip_and_sum, per_sample_norms, TrainUnet};
    for f in ["norms.npy", "clipped_sum.safetensors"] {
        dpaudit::report::output::check_file(&g.out.join(f), g.force).map_err(|e| e.with_field("--out"))?;
    }
    if let Some(c) = g.clip {
        if !(c > 0.0 && c.is_finite()) {
            return Err(Error::field("--clip", "must be a finite number > 0").into());
        }
    }
    let dev = candle_core::Device::Cpu;
    let dir = dpaudit::models::diffusers::unet_dir(&g.checkpoint).ok_or_else(|| {
        Error::input("not a diffusers checkpoint (no config.json, nor unet/config.json)").with_file(&g.checkpoint)
    })?;
    let cpath = dir.join("config.json");
    let config = dpaudit::models::unet2d::Unet2dConfig::parse(&dpaudit::input::read_to_string(&cpath)?, &cpath)?;
    let wpath = dir.join(dpaudit::models::diffusers::WEIGHTS);
    let (tensors, _, _) = dpaudit::models::diffusers::read_weights(&wpath, &dev)?;
    let model = TrainUnet::from_tensors(&config, tensors, &wpath, &dev)?;
    let (shape, x) = f32_batch(&g.input)?;
    let (eshape, e) = f32_batch(&g.noise)?;
    if eshape != shape {
        return Err(Error::input(format!("shape {eshape:?}, the input has {shape:?}"))
            .with_file(&g.noise)
            .into());
    }
    let t = npy::read(&g.timesteps)?;
    let ts: Vec<f64> = t
        .to_i64()
        .map(|v| v.iter().map(|&s| s as f64).collect())
        .or_else(|| t.to_f32().map(|v| v.iter().map(|&s| s as f64).collect()))
        .ok_or_else(|| Error::input("expected int64 or float32 timesteps").with_file(&g.timesteps))?;
    if ts.len() != shape[0] || ts.iter().any(|&s| s < 0.0) {
        return Err(
            Error::input(format!("expected {} timesteps ≥ 0, one per input image", shape[0]))
                .with_file(&g.timesteps)
                .into(),
        );
    }
    if g.hand_written {
        use dpaudit::models::unet2d::grad_cpu::{unsupported, CpuGrad};
        if let Some(why) = unsupported(&config) {
            return Err(
                Error::field("--hand-written", format!("the hand-written pass does not cover {why}"))
                    .with_file(&cpath)
                    .into(),
            );
        }
        let mut pass = CpuGrad::new(&model, [shape[1], shape[2], shape[3]]).map_err(|err| err.with_file(&g.input))?;
        let r = pass.clipped_sum(&x, &ts, &e, g.clip, 1.0)?;
        std::fs::create_dir_all(&g.out).map_err(|err| Error::io(&g.out, &err))?;
        let nf: Vec<f32> = r.norms.iter().map(|&v| v as f32).collect();
        dpaudit::report::output::write_atomic(&g.out.join("norms.npy"), &npy::encode_f32(&[nf.len()], &nf), g.force)?;
        if g.clip.is_some() {
            let sum = pass.to_tensors(&r.sum, &dev)?;
            let p = g.out.join("clipped_sum.safetensors");
            candle_core::safetensors::save(&sum, &p).map_err(|err| Error::model(err.to_string()))?;
        }
        eprintln!(
            "wrote per-sample gradient norms of {} samples to {} (hand-written CPU pass)",
            nf.len(),
            g.out.display()
        );
        return Ok(dpaudit::audit::outcome::Status::Ok);
    }
    let dims = (shape[0], shape[1], shape[2], shape[3]);
    let xt = candle_core::Tensor::from_vec(x, dims, &dev)?;
    let et = candle_core::Tensor::from_vec(e, dims, &dev)?;
    let per = if g.per_sample_loop {
        model.per_sample_grads_loop(&xt, &ts, &et)
    } else {
        model.per_sample_grads(&xt, &ts, &et)
    }
    .map_err(|err| err.with_file(&g.input))?;
    let norms = per_sample_norms(&per)?;
    std::fs::create_dir_all(&g.out).map_err(|err| Error::io(&g.out, &err))?;
    let nf: Vec<f32> = norms.iter().map(|&v| v as f32).collect();
    dpaudit::report::output::write_atomic(&g.out.join("norms.npy"), &npy::encode_f32(&[nf.len()], &nf), g.force)?;
    if let Some(c) = g.clip {
        let (sum, _) = clip_and_sum(&per, c)?;
        let p = g.out.join("clipped_sum.safetensors");
        candle_core::safetensors::save(&sum, &p).map_err(|err| Error::model(err.to_string()))?;
    }
    eprintln!(
        "wrote per-sample gradient norms of {} samples to {}",
        norms.len(),
        g.out.display()
    );
    Ok(dpaudit::audit::outcome::Status::Ok)
}
