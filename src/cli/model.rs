//! `dpaudit model eval|info|grads|relocate|keygen`: flags → the requests of [`dpaudit::audit::model`]
//! (run a diffusers checkpoint on a batch to check against PyTorch that it was loaded right,
//! describe it, its per-sample gradients) and key pairs for signed provenance.

use std::path::PathBuf;

use crate::cli::values::DeviceChoice;

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
    /// After a trained folder was moved: rewrite the --out and --init its card, ledger comment
    /// and training.json record to where the folders are now, and seal the card again (the
    /// event, weights, config and scheduler are not touched; the card says it was relocated).
    Relocate(RelocateArgs),
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
struct RelocateArgs {
    /// The folder where it is now (a `train --unet` output folder or a pipeline folder).
    folder: PathBuf,
    /// A signed folder: sign it again with this secret key (the key that signed it).
    #[arg(long, conflicts_with = "drop_signature")]
    sign_key: Option<PathBuf>,
    /// A signed folder: remove its signature instead (the folder is then unsigned).
    #[arg(long)]
    drop_signature: bool,
}

#[derive(Debug, clap::Args)]
struct KeygenArgs {
    /// Folder for the key pair (created when missing; existing key files are never replaced).
    #[arg(long)]
    out: PathBuf,
}

/// `model keygen`: a new key pair, never replacing a key file.
fn keygen(k: KeygenArgs) -> anyhow::Result<dpaudit::audit::outcome::Verdict> {
    for p in dpaudit::audit::model::keygen(&k.out)? {
        eprintln!("wrote {}", p.display());
    }
    Ok(dpaudit::audit::outcome::Verdict::Holds)
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
pub fn run(a: Args) -> anyhow::Result<dpaudit::audit::outcome::Verdict> {
    match a.cmd {
        Sub::Grads(g) => grads(g),
        Sub::Keygen(k) => keygen(k),
        Sub::Relocate(r) => {
            let note = dpaudit::audit::model::relocate(&dpaudit::audit::model::RelocateRequest {
                folder: r.folder,
                sign_key: r.sign_key,
                drop_signature: r.drop_signature,
            })?;
            eprintln!("{note}");
            Ok(dpaudit::audit::outcome::Verdict::Holds)
        }
        Sub::Info(i) => {
            let out = i.output.prepare(crate::cli::common::Format::Text, &[])?;
            Ok(out.emit(dpaudit::audit::model::info(&i.checkpoint)?)?)
        }
        Sub::Eval(e) => {
            let note = dpaudit::audit::model::eval(&dpaudit::audit::model::EvalRequest {
                checkpoint: e.checkpoint,
                input: e.input,
                timesteps: e.timesteps,
                out: e.out,
                force: e.force,
                batch: e.batch,
                device: e.device.into(),
                precision: e.precision.into(),
            })?;
            eprintln!("{note}");
            Ok(dpaudit::audit::outcome::Verdict::Holds)
        }
    }
}

/// `model grads`: per-sample gradients of a diffusers UNet on one batch.
fn grads(g: GradsArgs) -> anyhow::Result<dpaudit::audit::outcome::Verdict> {
    let note = dpaudit::audit::model::grads(&dpaudit::audit::model::GradsRequest {
        checkpoint: g.checkpoint,
        input: g.input,
        timesteps: g.timesteps,
        noise: g.noise,
        clip: g.clip,
        out: g.out,
        per_sample_loop: g.per_sample_loop,
        hand_written: g.hand_written,
        force: g.force,
    })?;
    eprintln!("{note}");
    Ok(dpaudit::audit::outcome::Verdict::Holds)
}
