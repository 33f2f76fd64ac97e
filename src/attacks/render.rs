//! Plain-text and CSV renderings of a [`MiaReport`] (`dpaudit mia --format text|csv`, and
//! `--roc-out`).

use std::fmt::Write as _;

use super::metrics::Interval;
use super::mia::AttackResult;
use super::pipeline::{MiaReport, Table2Row};

fn ci(v: f64, i: &Interval) -> String {
    format!("{v:.3} [{:.3}, {:.3}]", i.lo, i.hi)
}

/// The text report: what was attacked, each comparison with its basis, the attack table, the
/// audits, the null test, the cosine profile and Table 2.
pub fn text(r: &MiaReport) -> String {
    let mut s = String::new();
    if let Some(t) = &r.target {
        let _ = writeln!(s, "membership inference on {}", t.checkpoint);
        let _ = writeln!(
            s,
            "  model: {} ({} parameters), trained on {} ({} rows), {} steps",
            t.arch, t.parameters, t.trained_on, t.train_rows, t.steps
        );
        let _ = writeln!(s, "  command: {}", t.command);
        let _ = writeln!(s, "  training randomness: {}", t.randomness);
        let _ = writeln!(
            s,
            "  data: {}   split: {}   device: {}{}   attack seed: {}",
            r.data,
            r.split,
            r.device,
            r.backend
                .as_ref()
                .map(|b| format!("   backend: {b}"))
                .unwrap_or_default(),
            r.seed
        );
        if let Some(p) = &r.precision {
            let _ = writeln!(s, "  precision: {}", p.describe());
        }
    }
    if let Some(f) = &r.scores_file {
        let _ = writeln!(s, "membership inference from the scores in {f}");
    }
    for (name, b) in [("checkpoint", &r.checkpoint_basis), ("sampler", &r.sampler_basis)] {
        if let Some(b) = b {
            let _ = writeln!(s, "  {name} guarantee: {}", b.describe());
        }
    }
    for w in &r.warnings {
        let _ = writeln!(s, "  warning: {w}");
    }
    let _ = writeln!(
        s,
        "\n  {:<9} {:>4}  {:<22} {:>7} {:>8}  {:<22} {:<22} {:>9}",
        "attack", "t", "AUC [CI]", "TPR@1%", "TPR@0.1%", "ASR held-out thr. [CI]", "ASR oracle [CI]", "ASR limit"
    );
    let row = |s: &mut String, a: &AttackResult| {
        let _ = writeln!(
            s,
            "  {:<9} {:>4}  {:<22} {:>7.3} {:>8.3}  {:<22} {:<22} {:>9}",
            a.attack.as_str(),
            a.t,
            ci(a.auc, &a.auc_ci),
            a.tpr_at_1pct_fpr,
            a.tpr_at_01pct_fpr,
            ci(a.asr_heldout, &a.asr_heldout_ci),
            ci(a.asr_oracle, &a.asr_oracle_ci),
            a.limits
                .as_ref()
                .map(|l| format!("{:.4}", l.asr))
                .unwrap_or_else(|| "-".into())
        );
    };
    for a in &r.results {
        row(&mut s, a);
    }
    let _ = writeln!(
        s,
        "  ({:.0}% stratified bootstrap intervals; \"ASR held-out thr.\" is the empirical ASR at the held-out threshold of this one model: a measurement, not a bound)",
        r.confidence * 100.0
    );
    if !r.null_results.is_empty() {
        let _ = writeln!(
            s,
            "\n  null test (member labels shuffled at random; AUC and ASR should be near 0.5):"
        );
        for a in &r.null_results {
            row(&mut s, a);
        }
    }
    if let Some(a) = &r.one_run {
        let _ = writeln!(
            s,
            "\n  one-run audit ({}; Steinke, Nasr & Jagielski 2023, Thm 3.3): {} canaries, {} included, {} candidates (Bonferroni)",
            a.threat_model, a.canaries, a.included, a.candidates
        );
        if let Some(b) = &a.best {
            let _ = writeln!(
                s,
                "  best: {} at t = {}, k = {}: {} of {} guesses correct",
                b.attack, b.t, b.k_pos, b.correct, b.guesses
            );
        }
        let _ = writeln!(
            s,
            "  ε lower bound: {} at confidence {}, δ = {}",
            a.epsilon_lower, a.confidence, a.delta
        );
    }
    if let Some(w) = &r.white_box {
        let _ = writeln!(
            s,
            "\n  f-DP one-run audit (white-box; Mahloujifar, Melis & Chaudhuri 2025) against {}:",
            w.fdp.family
        );
        let _ = writeln!(
            s,
            "  ε lower bound: {} at confidence {}, δ = {} (the run acts like a noise multiplier below {}; the ledger's curve {})",
            crate::numeric::format::sig6(w.fdp.epsilon_lower),
            w.fdp.confidence,
            w.delta,
            w.fdp
                .sigma_rejected
                .map_or("none".to_string(), crate::numeric::format::sig6),
            if w.fdp.ledger_rejected { "is rejected" } else { "is not rejected" }
        );
    }
    if let Some(w) = &r.white_box {
        let t = &w.trials;
        let _ = writeln!(
            s,
            "  independent-trials audit (white-box): ε lower bound {} at confidence {}, δ = {} ({} false positives of {}, {} false negatives of {})",
            crate::numeric::format::sig6(t.epsilon_lower),
            t.confidence,
            w.delta,
            t.false_positives,
            t.test_out,
            t.false_negatives,
            t.test_in
        );
    }
    if let Some(w) = &r.white_box {
        let g = &w.gaussian;
        let _ = writeln!(
            s,
            "  Gaussian-shift audit (white-box): μ̂ = {}, μ ≥ {} at confidence {}: ε ≥ {} at δ = {} ({})",
            crate::numeric::format::sig6(g.mu_hat),
            crate::numeric::format::sig6(g.mu_lower),
            g.confidence,
            crate::numeric::format::sig6(g.epsilon_lower),
            w.delta,
            if g.kind == crate::accountants::BoundKind::LowerBound {
                "lower bound: full-batch Gaussian mechanism"
            } else {
                "ESTIMATE: a Poisson-subsampled statistic is only asymptotically Gaussian; never decides"
            }
        );
    }
    if let Some(a) = &r.many_runs {
        let _ = writeln!(
            s,
            "\n  many-runs audit: {} (attack, t) pairs (Bonferroni); ε lower bound {} at confidence {}, δ = {}",
            a.pairs.len(),
            a.epsilon_lower,
            a.confidence,
            a.delta
        );
    }
    let _ = writeln!(
        s,
        "\n  comparisons (each against the guarantee of the mechanism it attacks):"
    );
    for c in &r.comparisons {
        let _ = writeln!(s, "  - {} on the {}: {}", c.what, c.mechanism, c.outcome);
        let _ = writeln!(s, "      measured: {}", c.measured);
        let _ = writeln!(s, "      basis: {}", c.basis);
    }
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
                (|r: &Table2Row| r.asr_secmi) as fn(&Table2Row) -> f64,
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
    for c in r.violations() {
        let _ = writeln!(s, "\n  {} — {}", c.outcome, c.what);
    }
    let _ = writeln!(s, "\n  elapsed: {:.1} s", r.elapsed_s);
    s
}

/// One CSV row per attack result (and null-test result).
pub fn csv(r: &MiaReport) -> crate::error::Result<String> {
    let mut w = crate::report::csv_out::Csv::new();
    w.row("attack,t,target,shuffled_labels,members,nonmembers,auc,auc_lo,auc_hi,tpr_at_1pct_fpr,tpr_at_01pct_fpr,asr_heldout,asr_heldout_lo,asr_heldout_hi,heldout_threshold,asr_oracle,asr_oracle_lo,asr_oracle_hi,asr_limit,asr_limit_source".split(','))?;
    for a in r.results.iter().chain(&r.null_results) {
        w.row([
            a.attack.as_str().to_string(),
            a.t.to_string(),
            match a.target {
                super::mia::Target::Checkpoint => "checkpoint",
                super::mia::Target::Sampler => "sampler",
            }
            .to_string(),
            a.shuffled_labels.to_string(),
            a.members.to_string(),
            a.nonmembers.to_string(),
            a.auc.to_string(),
            a.auc_ci.lo.to_string(),
            a.auc_ci.hi.to_string(),
            a.tpr_at_1pct_fpr.to_string(),
            a.tpr_at_01pct_fpr.to_string(),
            a.asr_heldout.to_string(),
            a.asr_heldout_ci.lo.to_string(),
            a.asr_heldout_ci.hi.to_string(),
            a.threshold.to_string(),
            a.asr_oracle.to_string(),
            a.asr_oracle_ci.lo.to_string(),
            a.asr_oracle_ci.hi.to_string(),
            a.limits.as_ref().map(|l| l.asr.to_string()).unwrap_or_default(),
            a.limits.as_ref().map(|l| l.asr_source.clone()).unwrap_or_default(),
        ])?;
    }
    w.into_string()
}

/// Every ROC point with the TPR limit of the attacked mechanism at that FPR.
pub fn roc_csv(r: &MiaReport) -> crate::error::Result<String> {
    let mut w = crate::report::csv_out::Csv::new();
    w.row(["attack", "t", "fpr", "tpr", "tpr_limit"])?;
    for a in &r.results {
        let Some(roc) = &a.roc else { continue };
        let basis = match a.target {
            super::mia::Target::Checkpoint => &r.checkpoint_basis,
            super::mia::Target::Sampler => &r.sampler_basis,
        };
        let gs = basis.as_ref().map_or(&[][..], |b| &b.guarantees[..]);
        for (f, t) in roc.fpr.iter().zip(&roc.tpr) {
            let lim = super::theory::tightest(gs, |g| g.tpr_limit(*f))
                .map(|x| x.0.to_string())
                .unwrap_or_default();
            w.row([
                a.attack.as_str().to_string(),
                a.t.to_string(),
                f.to_string(),
                t.to_string(),
                lim,
            ])?;
        }
    }
    w.into_string()
}
