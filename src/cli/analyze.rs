//! `dpaudit analyze <sampler.toml>`: per-step μ_t, totals for each accountant (with the kind of
//! number each gives), CLT validity warnings and the critical-window view.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::accountants::AccountantKind;
use crate::cli::common::{parse_accountants, Format};
use crate::cli::EXIT_OK;
use crate::diffusion::account::{AccountantLine, Analysis};
use crate::diffusion::sensitivity::StepRole;
use crate::diffusion::{analyze, SamplerConfig};
use crate::error::Error;

#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  \
dpaudit analyze fixtures/samplers/edm-cifar10-paper.toml\n  \
dpaudit analyze fixtures/samplers/edm-cifar10-subsampled.toml --accountant clt,pld --format json\n\n\
Reproduces the paper's Figure 6 full-batch μ ≈ 787.6 with the first fixture (convention C,\n\
2C/(β|D|) = 1). Exit code 2 on a bad configuration (file:line: field: message).")]
pub struct Args {
    /// Sampler configuration (TOML).
    pub config: PathBuf,
    /// Accountants: gdp, clt, rdp, pld or all (comma-separated).
    #[arg(long, default_value = "all")]
    pub accountant: String,
    /// Override the δ of the configuration.
    #[arg(long)]
    pub delta: Option<f64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write the output to this file instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let accountants = parse_accountants(&args.accountant)?;
    let mut cfg = SamplerConfig::load(&args.config)?;
    if let Some(d) = args.delta {
        if !(d > 0.0 && d < 1.0) {
            return Err(Error::field("--delta", format!("δ must be in (0, 1), got {d}")).into());
        }
        cfg.delta = d;
    }
    let a = analyze(&cfg, &accountants).map_err(|e| e.with_file(&args.config))?;
    let out = match args.format {
        Format::Text => render_text(&a),
        Format::Json => serde_json::to_string_pretty(&a)? + "\n",
        Format::Csv => render_csv(&a)?,
        Format::Md | Format::Html => {
            return Err(Error::unsupported(
                "--format md/html needs the report module, which this build does not have; use text, json or csv",
            )
            .into())
        }
    };
    match &args.out {
        Some(p) => std::fs::write(p, out).map_err(|e| Error::io(p, &e))?,
        None => print!("{out}"),
    }
    Ok(EXIT_OK)
}

/// Fixed-point for ordinary magnitudes, scientific otherwise.
fn num(x: f64) -> String {
    if x == 0.0 || (x.abs() >= 1e-4 && x.abs() < 1e6) {
        format!("{x:.6}")
    } else {
        format!("{x:.6e}")
    }
}

fn e6(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.6e}")
    }
}

fn line_text(l: &AccountantLine) -> String {
    let kind = l.kind.map(|k| k.as_str()).unwrap_or("-");
    let eps = l.epsilon.map(num).unwrap_or_else(|| "-".into());
    let mu = l.mu.map(|m| format!("μ = {}", e6(m))).unwrap_or_default();
    let mut s = format!(
        "  {:<4} {:<12} ε = {:<14} {:<16} {}",
        l.accountant.as_str(),
        kind,
        eps,
        mu,
        l.status
    );
    if let Some(n) = &l.note {
        let _ = write!(s, " ({n})");
    }
    if l.accountant == AccountantKind::Clt && l.epsilon.is_some() {
        s.push_str(" [estimate: never the guarantee]");
    }
    s.trim_end().to_string()
}

/// Plain-text rendering (stable: golden files compare it byte for byte).
pub fn render_text(a: &Analysis) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "sampler: {}", a.name);
    let _ = writeln!(s, "schedule: {}", a.schedule);
    let _ = writeln!(s, "step convention {}", a.convention_text);
    let _ = writeln!(
        s,
        "neighbouring: {}; δ = {:e}; C = {}; |D| = {}; p = {}; S = {} sample(s)",
        a.neighbouring, a.delta, a.clip_norm, a.dataset_size, a.subsample_rate, a.samples
    );
    let _ = writeln!(s, "density: {}", a.density);
    let _ = writeln!(
        s,
        "per-step μ_t = 2C/(p_t(x_t)|D|)·√(2Δt/t³) (diffusion-sampling-privacy.md §3.1, eq. 5); {} private step(s) per sample",
        a.private_steps
    );
    let _ = writeln!(s);
    let traj = a.steps.iter().any(|r| r.mu_min.is_some());
    let _ = write!(
        s,
        "{:>4} {:>13} {:>13} {:>13} {:>13} {:>8} {:>13} {:>13}",
        "step", "t_from", "t_to", "t", "Δt", "role", "μ_t", "cum. μ"
    );
    if traj {
        let _ = write!(s, " {:>13} {:>13}", "μ_t min", "μ_t median");
    }
    let _ = writeln!(s, " {:>13} {:>13}", "ε stop here", "ε switch here");
    for (r, w) in a
        .steps
        .iter()
        .zip(a.steps.iter().map(|r| a.window.iter().find(|w| w.index == r.index)))
    {
        let role = match r.role {
            StepRole::Public => "public",
            StepRole::Private => "private",
            StepRole::Skipped => "skipped",
        };
        let _ = write!(
            s,
            "{:>4} {:>13} {:>13} {:>13} {:>13} {:>8} {:>13} {:>13}",
            r.index,
            e6(r.t_from),
            e6(r.t_to),
            e6(r.t),
            e6(r.dt),
            role,
            e6(r.mu),
            e6(r.cumulative_mu)
        );
        if traj {
            let _ = write!(
                s,
                " {:>13} {:>13}",
                e6(r.mu_min.unwrap_or(0.0)),
                e6(r.mu_median.unwrap_or(0.0))
            );
        }
        match w {
            Some(w) => {
                let _ = writeln!(s, " {:>13} {:>13}", e6(w.stop_epsilon), e6(w.switch_epsilon));
            }
            None => {
                let _ = writeln!(s, " {:>13} {:>13}", "-", "-");
            }
        }
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "full-batch GDP μ over all private steps and samples: {} ({})",
        num(a.full_batch_mu),
        if a.subsample_rate < 1.0 {
            "ignores subsampling"
        } else {
            "exact"
        }
    );
    let _ = writeln!(s, "totals at δ = {:e} (kind: exact | upper_bound | estimate):", a.delta);
    for l in &a.accountants {
        let _ = writeln!(s, "{}", line_text(l));
    }
    match &a.guarantee {
        Some(g) => {
            let _ = writeln!(
                s,
                "guarantee: ε = {} at δ = {:e} ({}, {})",
                num(g.epsilon.unwrap_or(f64::NAN)),
                a.delta,
                g.accountant.as_str(),
                g.kind.map(|k| k.as_str()).unwrap_or("-")
            );
        }
        None if a.private_steps > 0 => {
            let _ = writeln!(s, "guarantee: none available (no sound accountant answered)");
        }
        None => {}
    }
    if !a.warnings.is_empty() {
        let _ = writeln!(s, "warnings:");
        for w in &a.warnings {
            let _ = writeln!(
                s,
                "  - [{}]{} {}",
                w.code,
                if w.severe { " SEVERE" } else { "" },
                w.message
            );
        }
    }
    let _ = writeln!(s, "critical window: \"ε stop here\" = GDP ε if sampling stops after the step; \"ε switch here\" = GDP ε if the empirical denoiser takes over at the step (full-batch μ, {})",
        if a.subsample_rate < 1.0 { "an upper bound that ignores subsampling" } else { "exact" });
    let _ = writeln!(s, "event:");
    for l in a.ledger.lines() {
        let _ = writeln!(s, "  {l}");
    }
    s
}

/// CSV: one row per step, with the convention on every row.
pub fn render_csv(a: &Analysis) -> anyhow::Result<String> {
    use crate::diffusion::sweep::fmt;
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "convention",
        "step",
        "t_from",
        "t_to",
        "t",
        "dt",
        "role",
        "mu",
        "mu_min",
        "mu_median",
        "mu_max",
        "cumulative_mu",
        "stop_epsilon",
        "switch_epsilon",
    ])?;
    for r in &a.steps {
        let win = a.window.iter().find(|w| w.index == r.index);
        let role = match r.role {
            StepRole::Public => "public",
            StepRole::Private => "private",
            StepRole::Skipped => "skipped",
        };
        w.write_record([
            a.convention.as_str().to_string(),
            r.index.to_string(),
            fmt(r.t_from),
            fmt(r.t_to),
            fmt(r.t),
            fmt(r.dt),
            role.to_string(),
            fmt(r.mu),
            r.mu_min.map(fmt).unwrap_or_default(),
            r.mu_median.map(fmt).unwrap_or_default(),
            r.mu_max.map(fmt).unwrap_or_default(),
            fmt(r.cumulative_mu),
            win.map(|w| fmt(w.stop_epsilon)).unwrap_or_default(),
            win.map(|w| fmt(w.switch_epsilon)).unwrap_or_default(),
        ])?;
    }
    Ok(String::from_utf8(w.into_inner()?)?)
}
