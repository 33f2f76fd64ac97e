//! `dpaudit analyze <sampler.toml>`: per-step μ_t, totals for each accountant (with the kind of
//! number each gives), CLT validity warnings and the critical-window view.

use std::path::PathBuf;

use crate::cli::common::{parse_accountants, Format, OutputArgs};
use dpaudit::audit::analyze;
use dpaudit::audit::outcome::Verdict;
use dpaudit::error::Error;

#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  \
dpaudit analyze fixtures/samplers/edm-cifar10-paper.toml\n  \
dpaudit analyze fixtures/samplers/edm-cifar10-paper.toml -v   # every step and the event tree\n  \
dpaudit analyze fixtures/samplers/edm-cifar10-subsampled.toml --accountant clt,pld --format json\n\n\
Reproduces the paper's Figure 6 full-batch μ ≈ 787.6 with the first fixture (convention C,\n\
2C/(β|D|) = 1).\n\n\
A diffusers scheduler_config.json (DDPMScheduler or DDIMScheduler; detected by extension or\n\
content) is analysed directly; the flags say what the file cannot (each default is warned):\n  \
dpaudit analyze scheduler_config.json --dataset-size 50000 --clip 1 --samples 100 --inference-steps 50\n\n\
Exit code 2 on a bad configuration (file:line: field: message).")]
/// Per-step privacy analysis of a diffusion sampler configuration.
pub struct Args {
    /// Sampler configuration (TOML).
    pub config: PathBuf,
    /// Accountants: gdp, clt, rdp, pld or all (comma-separated).
    #[arg(long, default_value = "all")]
    pub accountant: String,
    /// Override the δ of the configuration.
    #[arg(long)]
    pub delta: Option<f64>,
    /// With a scheduler_config.json: the private data set size |D| (required).
    #[arg(long, value_name = "N")]
    pub dataset_size: Option<u64>,
    /// With a scheduler_config.json: the clipping norm C (default 1, warned).
    #[arg(long, value_name = "C")]
    pub clip: Option<f64>,
    /// With a scheduler_config.json: generated samples S (default 1, warned).
    #[arg(long, value_name = "S")]
    pub samples: Option<u64>,
    /// With a scheduler_config.json: ddim, ddpm, edm-heun or flow-euler (default: the
    /// scheduler's class, warned).
    #[arg(long, value_parser = ["ddim", "ddpm", "edm-heun", "flow-euler"])]
    pub sampler: Option<String>,
    /// With a scheduler_config.json: inference steps (default: every training step, warned).
    #[arg(long, value_name = "K")]
    pub inference_steps: Option<usize>,
    /// Output grammar: --format, --out DIR, --force, -q, -v.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Runs `dpaudit analyze`.
pub fn run(args: Args) -> anyhow::Result<Verdict> {
    let out = args.output.prepare(Format::Text, &["analyze.csv", "analyze.json"])?;
    let scheduler = scheduler_flags(&args)?;
    let plan = analyze::Plan {
        verbose: args.output.verbose > 0,
        config: args.config,
        accountants: parse_accountants(&args.accountant)?,
        delta: args
            .delta
            .map(|d| {
                if d > 0.0 && d < 1.0 {
                    Ok(d)
                } else {
                    Err(Error::field("--delta", format!("δ must be in (0, 1), got {d}")))
                }
            })
            .transpose()?,
        scheduler,
    };
    Ok(out.emit(analyze::execute(&plan)?)?)
}

/// The scheduler_config.json flags, checked (errors name the flag).
fn scheduler_flags(a: &Args) -> anyhow::Result<dpaudit::diffusion::sampler::SchedulerFlags> {
    use dpaudit::diffusion::sampler::SamplerKind;
    if a.dataset_size == Some(0) {
        return Err(Error::field("--dataset-size", "must be ≥ 1").into());
    }
    if let Some(c) = a.clip.filter(|c| !(*c > 0.0 && c.is_finite())) {
        return Err(Error::field("--clip", format!("must be a finite number > 0, got {c}")).into());
    }
    if a.samples == Some(0) {
        return Err(Error::field("--samples", "must be ≥ 1").into());
    }
    if let Some(k) = a.inference_steps.filter(|&k| k < 2) {
        return Err(Error::field("--inference-steps", format!("must be ≥ 2, got {k}")).into());
    }
    Ok(dpaudit::diffusion::sampler::SchedulerFlags {
        dataset_size: a.dataset_size,
        clip_norm: a.clip,
        samples: a.samples,
        sampler: a.sampler.as_deref().map(|s| match s {
            "ddim" => SamplerKind::Ddim,
            "ddpm" => SamplerKind::Ddpm,
            "edm-heun" => SamplerKind::EdmHeun,
            _ => SamplerKind::FlowEuler,
        }),
        inference_steps: a.inference_steps,
        delta: None,
    })
}
