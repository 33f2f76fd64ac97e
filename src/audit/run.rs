//! Mechanisms on data (`run dpagg-ti|dp-rdm`): execute, keep the ledger of what ran, audit the
//! implementation (sensitivity check, distinguishing audit), and build the shared [`Report`] plus
//! the run's own files (`ledger.toml`, `outputs.csv`, `run.json`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::outcome::Outcome;
use crate::accountants::sound;
use crate::accountants::AccountantKind;
use crate::error::{Error, Result};
use crate::events::{DpEvent, EventFile, Neighbouring};
use crate::pipelines::audit::{self, DistinguishingReport, SensitivityReport};
use crate::pipelines::mechanisms::{self, DpRdmConfig, DpaggTi, DpaggTiConfig, Fault};
use crate::report::{self, num, Cell, Column, Conclusion, Report, Table, Verdict};

/// The files a run writes into `--out DIR` besides the report.
pub const RUN_FILES: [&str; 3] = ["ledger.toml", "outputs.csv", "run.json"];

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Mechanism config (TOML).
    pub config: PathBuf,
    /// Seed (overrides the config's).
    pub seed: Option<u64>,
    /// Run the audits.
    pub audit: bool,
    /// Runs per side of the distinguishing audit.
    pub audit_runs: usize,
    /// Trials of the sensitivity check.
    pub audit_trials: usize,
    /// A known bug to inject (DPAgg-TI only).
    pub inject_fault: Fault,
}

/// The mechanism to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// DPAgg-TI.
    DpaggTi,
    /// DP-RDM.
    DpRdm,
}

/// A validated `run` request.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The mechanism.
    pub mechanism: Mechanism,
    /// Its options.
    pub options: Options,
}

/// `run`: executes the mechanism (and its audits); the outcome carries `ledger.toml`,
/// `outputs.csv` and `run.json`, and is violated when an audit fails.
pub fn execute(plan: &Plan) -> Result<Outcome> {
    match plan.mechanism {
        Mechanism::DpaggTi => run_dpagg(&plan.options),
        Mechanism::DpRdm => run_rdm(&plan.options),
    }
}

#[derive(Debug, Serialize)]
struct RunRecord<R: Serialize> {
    mechanism: &'static str,
    config: String,
    run: R,
    #[serde(skip_serializing_if = "Option::is_none")]
    sensitivity: Option<SensitivityReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    distinguishing: Option<DistinguishingReport>,
    fault: Fault,
    /// The seed of the release (None: OS randomness); in `run` inside the record.
    #[serde(skip)]
    seed: Option<u64>,
}

/// Runs DPAgg-TI.
pub(crate) fn run_dpagg(a: &Options) -> Result<Outcome> {
    let (cfg, mut mech) = DpaggTiConfig::load(&a.config)?;
    if a.inject_fault != Fault::None {
        let raw = crate::pipelines::embeddings::Embeddings::load_csv(
            &a.config.parent().unwrap_or(Path::new(".")).join(&cfg.embeddings),
        )?;
        mech = DpaggTi::new(
            &raw,
            cfg.m.get() as usize,
            cfg.epsilon.get(),
            cfg.delta.map(|d| d.get()),
            cfg.sigma_rule,
            cfg.sigma.map(|s| s.get()),
            a.inject_fault,
        )?;
    }
    let seed = a.seed.or(cfg.seed);
    // The audits' own trials are reproducible (public seed); the releases are not, unless seeded.
    let audit_seed = seed.unwrap_or(0);
    let (run, budget) =
        mechanisms::run_dpagg_ti_noise(&mech, cfg.releases.get(), cfg.budget_epsilon.map(|e| e.get()), seed)?;
    let (sens, dist) = if a.audit {
        let s = audit::dpagg_ti_sensitivity(&mech, a.audit_trials, audit_seed ^ 0x5e45);
        // Accounted upper bound of one release: exact Gaussian ε (no amplification credit).
        let upper = crate::accountants::AccountantKind::Gdp
            .build()
            .epsilon(
                &DpEvent::gaussian(mech.noise_multiplier),
                Neighbouring::ReplaceOne,
                mech.delta,
            )?
            .epsilon;
        let d = audit::dpagg_ti_distinguishing(&mech, a.audit_runs, upper, 0.05, audit_seed ^ 0xd157)?;
        (Some(s), Some(d))
    } else {
        (None, None)
    };
    let failed = sens.as_ref().is_some_and(|s| !s.ok) || dist.as_ref().is_some_and(|d| d.violation);
    let header = format!(
        "dpaudit run dpagg-ti {}\nrandomness: {}\nn = {}, m = {}, sigma = {}, noise_multiplier = {} (sensitivity 2/m), seed = {}\n\
         released = {}, refused = {}{}",
        a.config.display(),
        run.randomness,
        run.n,
        run.m,
        num::fmt_num(run.sigma),
        num::fmt_num(run.noise_multiplier),
        seed_text(seed),
        run.released,
        run.refused,
        budget_text(cfg.budget_epsilon.map(|e| e.get()), "gdp, each release as an unsampled Gaussian"),
    );
    let rows = run.outputs.clone();
    let rep = RunRecord {
        mechanism: "dpagg-ti",
        config: a.config.display().to_string(),
        run,
        sensitivity: sens,
        distinguishing: dist,
        fault: a.inject_fault,
        seed,
    };
    finish(a, "dpagg-ti", &rep, &rows, &budget.event_file(), &header, failed)
}

/// Runs DP-RDM.
pub(crate) fn run_rdm(a: &Options) -> Result<Outcome> {
    let (cfg, mech, queries) = DpRdmConfig::load(&a.config)?;
    if a.inject_fault != Fault::None {
        return Err(Error::field("--inject-fault", "only DPAgg-TI has injectable faults"));
    }
    let seed = a.seed.or(cfg.seed);
    let audit_seed = seed.unwrap_or(0);
    let delta = cfg.delta.map_or(1.0 / mech.private.len() as f64, |d| d.get());
    let accountant: AccountantKind = cfg.accountant;
    let (run, budget) =
        mechanisms::run_dp_rdm_noise(&mech, &queries, cfg.budget_epsilon.get(), delta, accountant, seed)?;
    let sens = a
        .audit
        .then(|| audit::dp_rdm_sensitivity(&mech, &queries.rows, a.audit_trials, audit_seed ^ 0x5e45));
    let failed = sens.as_ref().is_some_and(|s| !s.ok);
    let header = format!(
        "dpaudit run dp-rdm {}\nrandomness: {}\nn = {}, k = {}, q = {}, sigma = {}, lambda = {}, noise_multiplier = {} (Theorem 3.1, 2/k), seed = {}\n\
         answered = {}, refused = {}{}",
        a.config.display(),
        run.randomness,
        run.n,
        run.k,
        num::fmt_num(run.q),
        num::fmt_num(run.sigma),
        num::fmt_num(run.lambda),
        num::fmt_num(run.noise_multiplier),
        seed_text(seed),
        run.answered,
        run.refused,
        budget_text(Some(run.budget_epsilon), accountant.as_str()),
    );
    let rows: Vec<Vec<f64>> = run.answers.iter().map(|x| x.z.clone()).collect();
    let rep = RunRecord {
        mechanism: "dp-rdm",
        config: a.config.display().to_string(),
        run,
        sensitivity: sens,
        distinguishing: None,
        fault: Fault::None,
        seed,
    };
    finish(a, "dp-rdm", &rep, &rows, &budget.event_file(), &header, failed)
}

/// The budget line of a run's header: what the budget is and how releases are charged to it
/// (the charge is an upper bound of the run's ε, which the ledger line states).
fn budget_text(budget: Option<f64>, charged_by: &str) -> String {
    match budget {
        Some(b) => format!(
            ", budget ε = {} (releases past it refused; charged by {charged_by}, never below the run's ε)",
            num::fmt_num(b)
        ),
        None => String::new(),
    }
}

/// The run's one ε: the smallest sound ε of its ledger at the ledger's δ over every accountant,
/// exactly what `dpaudit account --event ledger.toml` reports (the report's results).
fn run_epsilon_line(r: &Report) -> String {
    match r.sound_epsilon() {
        Some(res) => format!(
            "epsilon of this run = {} at delta = {} ({}, {}: the ledger's event, as `dpaudit account --event ledger.toml` gives it)",
            num::fmt_num(res.epsilon),
            num::fmt_num(res.delta),
            res.source(),
            res.kind.as_str()
        ),
        None => "epsilon of this run: no accountant gives a sound bound for its ledger".into(),
    }
}

fn seed_text(seed: Option<u64>) -> String {
    seed.map_or_else(|| "none (OS CSPRNG)".into(), |s| s.to_string())
}

fn outputs_csv(rows: &[Vec<f64>]) -> Vec<u8> {
    let mut s = String::new();
    if let Some(r) = rows.first() {
        let head: Vec<String> = (0..r.len()).map(|i| format!("e{i}")).collect();
        s.push_str(&head.join(","));
        s.push('\n');
    }
    for r in rows {
        let v: Vec<String> = r.iter().map(|x| num::fmt(*x)).collect();
        s.push_str(&v.join(","));
        s.push('\n');
    }
    s.into_bytes()
}

fn ledger_toml(file: &EventFile, header: &str) -> Result<Vec<u8>> {
    let body = toml::to_string(file).map_err(|e| Error::input(format!("serialising the ledger: {e}")))?;
    let mut s = String::new();
    for l in header.lines() {
        s.push_str("# ");
        s.push_str(l);
        s.push('\n');
    }
    s.push_str(&body);
    Ok(s.into_bytes())
}

fn finish<R: Serialize>(
    a: &Options,
    mechanism: &str,
    rec: &RunRecord<R>,
    rows: &[Vec<f64>],
    ledger: &EventFile,
    header: &str,
    failed: bool,
) -> Result<Outcome> {
    let outputs = outputs_csv(rows);
    // One ε for the run, in the text, the ledger's header, run.json and the report alike.
    let mut report = to_report(a, mechanism, rec, ledger, header, failed)?;
    let eps_line = run_epsilon_line(&report);
    report.fact("run", eps_line.clone());
    let header = format!("{header}\n{eps_line}");
    // The ledger and run.json name the hash of the release they describe (checked by readers).
    let released = crate::report::output::released_line("outputs.csv", &outputs);
    let ledger_bytes = ledger_toml(ledger, &format!("{header}\n{released}"))?;
    let mut value = serde_json::to_value(rec).map_err(|e| Error::input(format!("run record: {e}")))?;
    if let Some(o) = value.as_object_mut() {
        if let Some(res) = report.sound_epsilon() {
            o.insert("epsilon".into(), res.epsilon.into());
            o.insert("delta".into(), res.delta.into());
            o.insert("epsilon_accountant".into(), res.source().into());
        }
        // The budget's own charge (an upper bound of `epsilon`, used only to refuse releases).
        if let Some(spent) = o
            .get_mut("run")
            .and_then(|r| r.as_object_mut())
            .and_then(|r| r.remove("epsilon_spent"))
        {
            o["run"]["budget_charge"] = spent;
        }
        o.insert("outputs_sha256".into(), report::sha256_hex(&outputs).into());
        o.insert("ledger_sha256".into(), report::sha256_hex(&ledger_bytes).into());
    }
    let json = serde_json::to_vec_pretty(&value).map_err(|e| Error::input(format!("run record: {e}")))?;
    let files = vec![
        ("ledger.toml".to_string(), ledger_bytes),
        ("outputs.csv".to_string(), outputs),
        ("run.json".to_string(), json),
    ];
    let mut s = String::new();
    let _ = writeln!(s, "{header}");
    if let Some(sr) = &rec.sensitivity {
        let _ = writeln!(
            s,
            "sensitivity check: largest change {} vs claimed bound {} over {} trials (ratio {}) → {}",
            report::export::fmt_num(sr.max_change),
            report::export::fmt_num(sr.claimed_bound),
            sr.trials,
            report::export::fmt_num(sr.ratio),
            if sr.ok { "ok" } else { "EXCEEDS THE CLAIMED SENSITIVITY" }
        );
    }
    if let Some(d) = &rec.distinguishing {
        let o = &d.outcome;
        let _ = writeln!(
            s,
            "distinguishing audit of one release: {} runs per side, FP {}/{} FN {}/{}, ε_lower = {} ({}% confidence) vs the accounted ε of one release = {} → {}",
            d.runs_per_side,
            o.false_positives,
            o.test_out,
            o.false_negatives,
            o.test_in,
            report::export::fmt_num(o.epsilon_lower),
            num::fmt_clean(o.confidence * 100.0),
            report::export::fmt_num(d.epsilon_upper),
            if d.violation { "LEAKS MORE THAN ACCOUNTED" } else { "consistent" }
        );
    }
    let _ = writeln!(s, "ledger:\n{}", ledger.event.ledger());
    let status = if failed {
        sound::Verdict::Violated
    } else {
        sound::Verdict::Holds
    };
    Ok(Outcome {
        report,
        text: s,
        table: None,
        files,
        status,
    })
}

fn to_report<R: Serialize>(
    a: &Options,
    mechanism: &str,
    rec: &RunRecord<R>,
    ledger: &EventFile,
    header: &str,
    failed: bool,
) -> Result<Report> {
    let mut r = Report::new(
        format!("Mechanism run: {mechanism} {}", a.config.display()),
        report::command_line(),
    )
    .for_command("run");
    r.seed = rec.seed;
    r.add_input("mechanism config", &a.config)?;
    r.event = Some(ledger.event.clone());
    r.delta = ledger.delta;
    r.assumptions.neighbouring = Some(ledger.neighbouring);
    for line in header.lines().skip(1) {
        r.fact("run", line.to_string());
    }
    // One ε for the run: the ledger's by every accountant at the ledger's δ, exactly as
    // `dpaudit account --event ledger.toml` gives it (the smallest sound one is the run's ε).
    if let Some(delta) = ledger.delta {
        crate::audit::accounting::account_event(
            &mut r,
            &ledger.event,
            ledger.neighbouring,
            delta,
            &AccountantKind::ALL,
            crate::audit::accounting::AccountOptions { curves: false },
            &mut |_| {},
        )?;
    }
    let mut audits = Table {
        id: "audits".into(),
        title: "Implementation audits".into(),
        columns: vec![
            Column::new("audit"),
            Column::new("measured"),
            Column::new("allowed"),
            Column::new("trials"),
            Column::new("result"),
        ],
        rows: vec![],
        note: Some(
            "Sensitivity: largest output change when one record is replaced, against the claimed bound. \
Distinguishing: an empirical ε lower bound (Clopper–Pearson) against the accounted ε upper bound."
                .into(),
        ),
    };
    if let Some(sr) = &rec.sensitivity {
        audits.rows.push(vec![
            Cell::from("sensitivity"),
            Cell::Num(sr.max_change),
            Cell::Num(sr.claimed_bound),
            Cell::from(sr.trials),
            Cell::from(if sr.ok { "ok" } else { "exceeds the claimed sensitivity" }),
        ]);
        r.verdicts.push(Verdict {
            subject: "claimed sensitivity".into(),
            status: if sr.ok {
                sound::Verdict::Holds
            } else {
                sound::Verdict::Violated
            },
            budget: None,
            evidence: None,
            margin: None,
            message: format!(
                "largest change {} vs claimed bound {}",
                report::export::fmt_num(sr.max_change),
                report::export::fmt_num(sr.claimed_bound)
            ),
        });
    }
    if let Some(d) = &rec.distinguishing {
        audits.rows.push(vec![
            Cell::from("distinguishing (ε lower bound)"),
            Cell::Num(d.outcome.epsilon_lower),
            Cell::Num(d.epsilon_upper),
            Cell::from(d.runs_per_side),
            Cell::from(if d.violation {
                "leaks more than accounted"
            } else {
                "consistent"
            }),
        ]);
        r.verdicts.push(Verdict {
            subject: "one release's accounted ε against the distinguishing audit".into(),
            status: if d.violation {
                sound::Verdict::Violated
            } else {
                sound::Verdict::Holds
            },
            budget: Some(d.epsilon_upper),
            // A Clopper–Pearson lower bound, labelled as one (never under "sound ε").
            evidence: Some(sound::Evidence::new(
                "Clopper–Pearson audit",
                d.outcome.epsilon_lower,
                d.outcome.delta,
                crate::accountants::BoundKind::LowerBound,
            )),
            margin: Some(d.epsilon_upper - d.outcome.epsilon_lower),
            message: format!(
                "Clopper–Pearson ε lower bound {} vs the accounted ε {} of one release",
                report::export::fmt_num(d.outcome.epsilon_lower),
                report::export::fmt_num(d.epsilon_upper)
            ),
        });
    }
    if !audits.rows.is_empty() {
        r.tables.push(audits);
    }
    let derived = crate::report::conclusion::derive(&r);
    r.conclusion = Some(Conclusion {
        audited: format!("A run of the {mechanism} mechanism on the data of `{}`.", a.config.display()),
        guarantee: match r.sound_epsilon() {
            Some(_) => derived.guarantee,
            None => "No guarantee was shown: the ledger (ledger.toml) could not be accounted.".into(),
        },
        verdict: if rec.sensitivity.is_none() && rec.distinguishing.is_none() {
            "No audit was run (--audit), so there is no verdict.".into()
        } else if failed {
            "FAIL: an audit shows the implementation leaks more than its claim.".into()
        } else {
            "PASS: the audits found nothing beyond the claimed sensitivity and accounted ε.".into()
        },
        // The ledger's estimates (CLT) listed as the other reports list them, then the audits'.
        estimates: format!(
            "{} Audit numbers are measurements on random trials (the ε lower bound holds with the stated confidence), not guarantees.",
            derived.estimates
        ),
    });
    Ok(r)
}
