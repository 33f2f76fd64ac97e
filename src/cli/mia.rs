//! `dpaudit mia`: membership-inference attacks on a trained denoiser, with the theoretical limits
//! its DP ledger implies beside the measured numbers.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::attacks::mia::{AttackKind, AttackResult, MetricOpts, ScoreOpts};
use crate::attacks::pipeline::{self, MiaPlan, MiaReport, Table2Opts};
use crate::cli::common::{Format, OutputArgs};
use crate::error::Error;
use crate::models::{device, Checkpoint, Dataset, DeviceChoice, SplitManifest};

const EXAMPLES: &str = "\
Examples:
  # All attacks on the shipped non-DP checkpoint, at steps 10, 50, 100 and T/4:
  dpaudit mia --checkpoint models/digits-mlp.toml

  # The strongly DP (RAPID) checkpoint: empirical ASR beside the limit its ledger implies,
  # plus the null test (labels shuffled at random: ε_lower must be 0):
  dpaudit mia --checkpoint models/digits-rapid.toml --null-test --format json > mia.json

  # Table-2-style comparison (diffusion-sampling-privacy §6.4): cosine similarity of empirical
  # and neural denoising directions, theoretical ASR of the empirical-denoiser sampler at
  # p = 1, 0.5, 0.01, 0.005, and measured ASR, at t = T, 3T/4, T/2, T/4:
  dpaudit mia --checkpoint models/digits-mlp.toml --table2 --attack loss --timesteps 10

  # The ROC of every attack with the theoretical TPR limit, for plotting:
  dpaudit mia --checkpoint models/digits-rapid.toml --roc-out roc.csv

Formats: text (default), csv (one row per attack), json, md and html (the shared report:
tables, the ROC against the theoretical limit, the cosine profile). --out DIR writes the report
in every format plus mia.json (the detailed record) and mia.csv.

Exit codes: 0 ok; 1 an attack's ε lower bound exceeds the accounted ε (the accounting or the
training is wrong); 2 bad input (e.g. checkpoint and config do not match).";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
/// Membership-inference attacks on a trained denoiser.
pub struct Args {
    /// Checkpoint card (<stem>.toml), weights (<stem>.safetensors) or stem.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Data file (default: the card's).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Split manifest (default: the card's).
    #[arg(long)]
    pub split: Option<PathBuf>,
    /// Attacks, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "loss,secmi,pia,empirical")]
    pub attack: Vec<AttackKind>,
    /// Steps to attack at: integers or fractions of T (T, 3T/4, T/2, T/4, 0.1T), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10,50,100,T/4")]
    pub timesteps: Vec<String>,
    /// Noise draws averaged by the loss and empirical attacks.
    #[arg(long, default_value_t = 4)]
    pub noise_draws: usize,
    /// SecMI's step k.
    #[arg(long, default_value_t = 10)]
    pub secmi_k: usize,
    /// Poisson rate of the empirical denoiser's data (1 = full batch).
    #[arg(long, default_value_t = 1.0)]
    pub empirical_rate: f64,
    /// Bootstrap resamples for the intervals.
    #[arg(long, default_value_t = 1000)]
    pub bootstrap: usize,
    /// Confidence of the bootstrap intervals and of the ε lower bound.
    #[arg(long, default_value_t = 0.95)]
    pub confidence: f64,
    /// δ for the ε lower bound and the accounted guarantee.
    #[arg(long, default_value_t = 1e-5)]
    pub delta: f64,
    #[arg(long, default_value_t = 0)]
    /// Seed of the noise draws, splits and bootstrap.
    pub seed: u64,
    /// Also run every attack with member labels shuffled at random (null test).
    #[arg(long)]
    pub null_test: bool,
    /// Add the Table-2-style comparison (t = T, 3T/4, T/2, T/4).
    #[arg(long)]
    pub table2: bool,
    /// Subsampling rates p of the sampler in the Table-2 comparison.
    #[arg(long, value_delimiter = ',', default_value = "1,0.5,0.01,0.005")]
    pub table2_rates: Vec<f64>,
    /// Steps of a cosine-similarity profile (the paper's Figure 1), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub cosine: Vec<String>,
    /// Output grammar: --format, --out DIR, --force, -q, -v.
    #[command(flatten)]
    pub output: OutputArgs,
    /// Write every ROC point (with the theoretical TPR limit) as CSV.
    #[arg(long)]
    pub roc_out: Option<PathBuf>,
    /// Device to run the model on (auto: CUDA when built with it and present, else CPU).
    #[arg(long, value_enum, default_value = "auto")]
    /// Device to run the model on (auto: CUDA when built with it and present, else CPU).
    pub device: DeviceChoice,
}

fn ci(v: f64, i: &crate::attacks::metrics::Interval) -> String {
    format!("{v:.3} [{:.3}, {:.3}]", i.lo, i.hi)
}

fn text(r: &MiaReport) -> String {
    let mut s = String::new();
    let t = &r.target;
    let _ = writeln!(s, "membership inference on {}", t.checkpoint);
    let _ = writeln!(
        s,
        "  model: {} ({} parameters), trained on {} ({} rows), {} steps",
        t.arch, t.parameters, t.trained_on, t.train_rows, t.steps
    );
    let _ = writeln!(s, "  command: {}", t.command);
    let _ = writeln!(
        s,
        "  data: {}   split: {}   device: {}   seed: {}",
        r.data, r.split, r.device, r.seed
    );
    match &t.dp {
        None => {
            let _ = writeln!(s, "  DP: none (no theoretical limit applies)");
        }
        Some(dp) => {
            let _ = writeln!(
                s,
                "  DP: σ = {}, C = {}, q = {}, {} steps{}",
                dp.noise_multiplier,
                dp.clip,
                dp.sample_rate,
                dp.steps,
                dp.rapid
                    .as_ref()
                    .map(|r| format!(" (RAPID: k = {}, v = {}, knowledge base of {})", r.k, r.v, r.kb_rows))
                    .unwrap_or_default()
            );
            for g in &r.guarantees {
                let _ = writeln!(
                    s,
                    "  accounted: ε = {:.4} at δ = {:e} [{}, {}]{}",
                    g.epsilon,
                    g.delta,
                    g.source,
                    g.kind.as_str(),
                    g.mu.map(|m| format!(", μ = {m:.4}")).unwrap_or_default()
                );
            }
            for k in &r.accountants_skipped {
                let _ = writeln!(s, "  (not used: {k})");
            }
        }
    }
    let _ = writeln!(
        s,
        "\n  {:<9} {:>4}  {:<22} {:>7} {:>8}  {:<22} {:<22} {:>9}  {:>9}",
        "attack", "t", "AUC [CI]", "TPR@1%", "TPR@0.1%", "ASR held-out [CI]", "ASR oracle [CI]", "ε_lower", "ASR limit"
    );
    let row = |s: &mut String, a: &AttackResult| {
        let _ = writeln!(
            s,
            "  {:<9} {:>4}  {:<22} {:>7.3} {:>8.3}  {:<22} {:<22} {:>9.3}  {:>9}",
            a.attack.as_str(),
            a.t,
            ci(a.auc, &a.auc_ci),
            a.tpr_at_1pct_fpr,
            a.tpr_at_01pct_fpr,
            ci(a.asr_heldout, &a.asr_heldout_ci),
            ci(a.asr_oracle, &a.asr_oracle_ci),
            a.eps_lower.epsilon_lower,
            a.limits
                .as_ref()
                .map(|l| format!("{:.4}", l.asr))
                .unwrap_or_else(|| "-".into())
        );
    };
    for a in &r.results {
        row(&mut s, a);
    }
    if let Some(l) = r.results.iter().find_map(|a| a.limits.as_ref()) {
        let _ = writeln!(
            s,
            "  limits ({}): ASR ≤ {:.4}, TPR@1% ≤ {:.4}, TPR@0.1% ≤ {:.4}",
            l.asr_source, l.asr, l.tpr_at_1pct, l.tpr_at_01pct
        );
    }
    if !r.null_results.is_empty() {
        let _ = writeln!(
            s,
            "\n  null test (member labels shuffled at random; ε_lower should be 0):"
        );
        for a in &r.null_results {
            row(&mut s, a);
        }
    }
    let _ = writeln!(
        s,
        "\n  CIs: {:.0}% stratified bootstrap; ε_lower: Clopper–Pearson at confidence {:.2}, δ = {:e}, threshold chosen on a held-out half",
        r.confidence * 100.0,
        r.confidence,
        r.delta
    );
    if !r.cosine.is_empty() {
        let _ = writeln!(s, "\n  cosine(empirical, neural denoising direction) (Figure 1):");
        let _ = writeln!(s, "  {:>5} {:>9} {:>8} {:>8}", "t", "log SNR", "mean", "min");
        for c in &r.cosine {
            let _ = writeln!(
                s,
                "  {:>5} {:>9.3} {:>8.4} {:>8.4}",
                c.t, c.log_snr, c.cosine_mean, c.cosine_min
            );
        }
    }
    if let Some(tb) = &r.table2 {
        let _ = writeln!(s, "\n  Table-2-style comparison:");
        let _ = write!(s, "  {:<28}", "t");
        for row in &tb.rows {
            let _ = write!(s, " {:>10}", format!("{} ({})", row.label, row.t));
        }
        let _ = writeln!(s);
        let _ = write!(s, "  {:<28}", "cosine similarity");
        for row in &tb.rows {
            let _ = write!(s, " {:>10.4}", row.cosine);
        }
        let _ = writeln!(s);
        for (i, p) in tb.rates.iter().enumerate() {
            let _ = write!(s, "  {:<28}", format!("theoretical ASR at p = {p}"));
            for row in &tb.rows {
                match row.theoretical_asr[i] {
                    Some(v) => {
                        let _ = write!(s, " {v:>10.4}");
                    }
                    None => {
                        let _ = write!(s, " {:>10}", "n/a");
                    }
                }
            }
            let _ = writeln!(s);
        }
        for (name, f) in [
            (
                "numerical ASR (SecMI)",
                (|r: &pipeline::Table2Row| r.asr_secmi) as fn(&pipeline::Table2Row) -> f64,
            ),
            ("numerical ASR (loss)", |r| r.asr_loss),
            ("numerical ASR (empirical)", |r| r.asr_empirical),
        ] {
            let _ = write!(s, "  {name:<28}");
            for row in &tb.rows {
                let _ = write!(s, " {:>10.4}", f(row));
            }
            let _ = writeln!(s);
        }
        let _ = writeln!(s, "  ({})", tb.note);
    }
    let _ = writeln!(s, "\n  elapsed: {:.1} s", r.elapsed_s);
    s
}

fn csv(r: &MiaReport) -> String {
    let mut s = String::from(
        "attack,t,shuffled_labels,members,nonmembers,auc,auc_lo,auc_hi,tpr_at_1pct_fpr,tpr_at_01pct_fpr,asr_heldout,asr_heldout_lo,asr_heldout_hi,asr_oracle,asr_oracle_lo,asr_oracle_hi,epsilon_lower,delta,asr_limit,asr_limit_source\n",
    );
    for a in r.results.iter().chain(&r.null_results) {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            a.attack.as_str(),
            a.t,
            a.shuffled_labels,
            a.members,
            a.nonmembers,
            a.auc,
            a.auc_ci.lo,
            a.auc_ci.hi,
            a.tpr_at_1pct_fpr,
            a.tpr_at_01pct_fpr,
            a.asr_heldout,
            a.asr_heldout_ci.lo,
            a.asr_heldout_ci.hi,
            a.asr_oracle,
            a.asr_oracle_ci.lo,
            a.asr_oracle_ci.hi,
            a.eps_lower.epsilon_lower,
            a.eps_lower.delta,
            a.limits.as_ref().map(|l| l.asr.to_string()).unwrap_or_default(),
            a.limits.as_ref().map(|l| l.asr_source.clone()).unwrap_or_default(),
        );
    }
    s
}

fn roc_csv(r: &MiaReport) -> String {
    let mut s = String::from("attack,t,fpr,tpr,tpr_limit\n");
    for a in &r.results {
        let Some(roc) = &a.roc else { continue };
        for (f, t) in roc.fpr.iter().zip(&roc.tpr) {
            let lim = crate::attacks::theory::tightest(&r.guarantees, |g| g.tpr_limit(*f))
                .map(|x| x.0.to_string())
                .unwrap_or_default();
            let _ = writeln!(s, "{},{},{},{},{}", a.attack.as_str(), a.t, f, t, lim);
        }
    }
    s
}

/// Runs `dpaudit mia`; returns the exit code.
pub fn run(a: Args) -> anyhow::Result<i32> {
    // Output locations are checked (and existing files refused) before any work.
    let out = a.output.prepare(Format::Text, &["mia.json", "mia.csv"])?;
    if let Some(p) = &a.roc_out {
        crate::report::output::check_file(p, out.force)?;
    }
    if !(a.confidence > 0.0 && a.confidence < 1.0) {
        return Err(Error::field("--confidence", "must be in (0, 1)").into());
    }
    if !(a.delta > 0.0 && a.delta < 1.0) {
        return Err(Error::field("--delta", "must be in (0, 1)").into());
    }
    if !(a.empirical_rate > 0.0 && a.empirical_rate <= 1.0) {
        return Err(Error::field("--empirical-rate", "must be in (0, 1]").into());
    }
    if a.table2_rates.iter().any(|p| !(*p > 0.0 && *p <= 1.0)) {
        return Err(Error::field("--table2-rates", "rates must be in (0, 1]").into());
    }
    let dev = device::select(a.device)?;
    let dev_name = device::describe(&dev);
    crate::report::progress::note(&format!("device: {dev_name}"));
    let ck = Checkpoint::load(&a.checkpoint, &dev)?;
    let data_path = a.data.clone().unwrap_or_else(|| PathBuf::from(&ck.card.data.file));
    let split_path = a.split.clone().unwrap_or_else(|| PathBuf::from(&ck.card.data.split));
    let data = Dataset::load(&data_path)?;
    let split = SplitManifest::load(&split_path)?;
    let timesteps = a
        .timesteps
        .iter()
        .map(|s| ck.schedule.parse_timestep(s))
        .collect::<crate::Result<Vec<_>>>()?;
    let cosine_steps = a
        .cosine
        .iter()
        .map(|s| ck.schedule.parse_timestep(s))
        .collect::<crate::Result<Vec<_>>>()?;
    let plan = MiaPlan {
        attacks: a.attack.clone(),
        timesteps,
        score: ScoreOpts {
            noise_draws: a.noise_draws,
            secmi_k: a.secmi_k,
            empirical_rate: a.empirical_rate,
            seed: a.seed,
        },
        metric: MetricOpts {
            bootstrap: a.bootstrap,
            level: a.confidence,
            delta: a.delta,
            alpha: 1.0 - a.confidence,
            seed: a.seed,
        },
        null_test: a.null_test,
        table2: a.table2.then(|| Table2Opts {
            rates: a.table2_rates.clone(),
            ..Default::default()
        }),
        cosine_steps,
    };
    let total = (plan.attacks.len() * plan.timesteps.len() + plan.table2.as_ref().map_or(0, |t| t.steps.len())) as u64;
    let bar = crate::report::progress::bar(total, out.quiet, "mia");
    let report = pipeline::run(&ck, &data, &split, &plan, &dev_name, Some(&bar))?;
    bar.finish_and_clear();
    let mut rep = report.to_report(&crate::report::command_line());
    rep.audit = "mia".into();
    rep.conclude();
    let detail = serde_json::to_vec_pretty(&report)?;
    out.finish_with_csv(
        &rep,
        &text(&report),
        "mia.csv",
        csv(&report).into_bytes(),
        vec![("mia.json".to_string(), detail)],
    )?;
    if let Some(p) = &a.roc_out {
        crate::report::output::write_atomic(p, roc_csv(&report).as_bytes(), out.force)?;
        crate::report::progress::note(&format!("wrote {}", p.display()));
    }
    // An empirical lower bound above the accounted upper bound refutes the accounting.
    if let Some((eps, src)) = crate::attacks::theory::tightest(&report.guarantees, |g| g.epsilon) {
        if let Some(bad) = report.results.iter().find(|r| r.eps_lower.epsilon_lower > eps) {
            eprintln!(
                "VIOLATION: {} at t = {} gives ε_lower = {:.4} > accounted ε = {:.4} ({src})",
                bad.attack.as_str(),
                bad.t,
                bad.eps_lower.epsilon_lower,
                eps
            );
            return Ok(crate::cli::EXIT_VIOLATED);
        }
    }
    Ok(crate::cli::EXIT_OK)
}
