//! Training (`train`): the shared [`Report`] of a trained checkpoint, built from its card (what
//! was trained, on which rows, how) and, for DP runs, the ledger of the DpEvent that ran.

use std::path::Path;

use crate::error::Result;
use crate::events::{DpEvent, Neighbouring};
use crate::models::checkpoint::Card;
use crate::models::diffusers_train::{UnetTrainOutcome, UnetTrainPlan};
use crate::report::export::fmt_num;
use crate::report::{self, Conclusion, Report};

/// Runs `train` on `device` (named `device_name` in the card): trains, writes the checkpoint,
/// card and ledger, and returns the report with the training log as its terminal text.
pub fn execute(
    plan: &crate::models::run::TrainPlan,
    device: &candle_core::Device,
    device_name: &str,
) -> Result<super::Outcome> {
    let outcome = crate::models::run::run(plan, device, device_name)?;
    let mut text = String::new();
    for l in &outcome.lines {
        text.push_str(l.trim_end());
        text.push('\n');
    }
    let rep = report(&outcome.card, &outcome.card_path, outcome.event.as_ref())?;
    Ok(super::Outcome::new(rep, text))
}

/// The report of a training run whose card was written to `card_path`.
pub fn report(card: &Card, card_path: &Path, ledger: Option<&DpEvent>) -> Result<Report> {
    let mut r = Report::new(format!("Training: {}", card_path.display()), report::command_line()).for_command("train");
    r.seed = card.training.seed;
    r.add_input("checkpoint card", card_path)?;
    training_facts(&mut r, card.parameters, &card.data, &card.training);
    let guarantee = match (&card.dp, ledger) {
        (Some(dp), Some(ev)) => {
            r.event = Some(ev.clone());
            r.delta = Some(dp.delta);
            r.assumptions.neighbouring = Some(Neighbouring::AddRemove);
            r.assumptions.sampling = Some(format!("Poisson, q = {}", fmt_num(dp.sample_rate)));
            r.fact("noise multiplier σ", fmt_num(dp.noise_multiplier))
                .fact("clip norm C", fmt_num(dp.clip))
                .fact("ledger", dp.ledger.clone());
            let spent = match (dp.epsilon, &dp.epsilon_accountant) {
                (Some(e), Some(acc)) => {
                    format!("ε = {} at δ = {} ({acc}, upper bound); ", fmt_num(e), fmt_num(dp.delta))
                }
                _ => String::new(),
            };
            format!(
                "{spent}Trained with DP-SGD (σ = {}, C = {}, q = {}, {} steps); the ledger {} records the event: account it \
with `dpaudit account --event {} --delta {}` for every accountant.",
                fmt_num(dp.noise_multiplier),
                fmt_num(dp.clip),
                fmt_num(dp.sample_rate),
                dp.steps,
                dp.ledger,
                dp.ledger,
                fmt_num(dp.delta)
            )
        }
        _ => "None: trained without differential privacy.".into(),
    };
    r.conclusion = Some(Conclusion {
        audited: format!(
            "A denoiser trained on {} rows ({}), written to `{}`.",
            card.data.rows,
            card.data.file,
            card_path.display()
        ),
        guarantee,
        verdict: "No budget or claim was checked; attack the checkpoint with `dpaudit mia`.".into(),
        estimates: "The losses are measurements on fixed evaluation draws, not privacy numbers.".into(),
    });
    Ok(r)
}

/// Runs `train --unet` on `device`: trains the diffusers UNet (DP-SGD when the plan says so),
/// writes the diffusers folder with its card and ledger, and returns the report with the training
/// log as its terminal text.
pub fn execute_unet(plan: &UnetTrainPlan, device: &candle_core::Device, device_name: &str) -> Result<super::Outcome> {
    let outcome = crate::models::diffusers_train::run(plan, device, device_name)?;
    let mut text = String::new();
    for l in &outcome.lines {
        text.push_str(l.trim_end());
        text.push('\n');
    }
    let rep = unet_report(&outcome)?;
    Ok(super::Outcome::new(rep, text))
}

/// The shared report of a `train --unet` run.
pub(crate) fn unet_report(o: &UnetTrainOutcome) -> Result<Report> {
    let card = &o.card;
    let mut r = Report::new(format!("Training: {}", o.dir.display()), report::command_line()).for_command("train");
    r.seed = card.training.seed;
    r.add_input("card", &o.dir.join(crate::models::folder::CARD))?;
    r.fact("architecture", card.architecture.clone());
    training_facts(&mut r, card.parameters, &card.data, &card.training);
    let guarantee = match (&card.dp, &o.event) {
        (Some(dp), Some(ev)) => {
            r.event = Some(ev.clone());
            r.delta = Some(dp.delta);
            r.assumptions.neighbouring = Some(Neighbouring::AddRemove);
            r.assumptions.sampling = Some(format!("Poisson, q = {}", fmt_num(dp.sample_rate)));
            r.fact("noise multiplier σ", fmt_num(dp.noise_multiplier))
                .fact("clip norm C", fmt_num(dp.clip))
                .fact(
                    "ledger",
                    o.dir.join(crate::models::folder::LEDGER).display().to_string(),
                );
            let spent = match (dp.epsilon, &dp.epsilon_accountant) {
                (Some(e), Some(acc)) => {
                    format!("ε = {} at δ = {} ({acc}, upper bound); ", fmt_num(e), fmt_num(dp.delta))
                }
                _ => String::new(),
            };
            format!(
                "{spent}Trained with DP-SGD (σ = {}, C = {}, q = {}, {} steps); the ledger {} records the event.",
                fmt_num(dp.noise_multiplier),
                fmt_num(dp.clip),
                fmt_num(dp.sample_rate),
                dp.steps,
                o.dir.join(crate::models::folder::LEDGER).display()
            )
        }
        _ => "None: trained without differential privacy.".into(),
    };
    r.conclusion = Some(Conclusion {
        audited: format!(
            "A diffusers UNet2DModel trained on {} rows ({}), written to `{}`.",
            card.data.rows,
            card.data.file,
            o.dir.display()
        ),
        guarantee,
        verdict: "No budget or claim was checked; attack the folder with `dpaudit mia`.".into(),
        estimates: "The losses are measurements on fixed evaluation draws, not privacy numbers.".into(),
    });
    Ok(r)
}

/// The facts every training report states: size, rows, optimiser, device, randomness, and the
/// denoising loss where it was measured (DP runs publish no loss measured on the private rows: it
/// is outside the ledger).
fn training_facts(
    r: &mut Report,
    parameters: usize,
    data: &crate::models::checkpoint::DataInfo,
    training: &crate::models::checkpoint::TrainingInfo,
) {
    r.fact("parameters", parameters.to_string())
        .fact("trained on", format!("{} rows of {}", data.rows, data.file))
        .fact("optimiser steps", training.steps.to_string())
        .fact("learning rate", fmt_num(training.lr))
        .fact("device", training.device.clone())
        .fact("randomness", training.randomness.clone());
    if let (Some(b), Some(a)) = (training.eval_loss_before, training.eval_loss_after) {
        let on = training.eval_on.clone().unwrap_or_default();
        r.fact(format!("denoising loss before ({on})"), fmt_num(b))
            .fact(format!("denoising loss after ({on})"), fmt_num(a));
    }
}

/// Opacus' way of stating a DP-SGD training: the expected batch size (`--batch-size`, so
/// q = B / N), epochs (`--epochs`, so steps = ⌈E / q⌉) and a target ε (`--target-epsilon`, σ
/// calibrated by the one calibration search, PLD first, landing on the safe side).
#[derive(Debug, Clone, Copy, Default)]
pub struct OpacusFlags {
    /// Expected batch size B under Poisson sampling.
    pub batch_size: Option<usize>,
    /// Epochs E.
    pub epochs: Option<f64>,
    /// Target ε at the run's δ.
    pub target_epsilon: Option<f64>,
}

/// What the Opacus flags resolve to: the sampling rate, steps and noise multiplier, with one
/// line per derived value saying how it was derived.
#[derive(Debug, Clone, PartialEq)]
pub struct OpacusResolved {
    /// q.
    pub sample_rate: f64,
    /// Steps.
    pub steps: usize,
    /// σ.
    pub noise_multiplier: f64,
    /// How each derived value was found.
    pub lines: Vec<String>,
}

/// Resolves [`OpacusFlags`] against `rows` private training rows, with `sample_rate`, `steps`
/// and `noise_multiplier` the values given otherwise (or their defaults). Errors name the flag.
pub fn resolve_opacus(
    flags: OpacusFlags,
    rows: usize,
    sample_rate: f64,
    steps: usize,
    noise_multiplier: f64,
    delta: f64,
) -> Result<OpacusResolved> {
    use crate::accountants::calibrate::{calibrate_dpsgd_any, DpSgd, SolveFor};
    use crate::error::Error;
    let mut lines = Vec::new();
    let mut q = sample_rate;
    if let Some(b) = flags.batch_size {
        if b == 0 || b > rows {
            return Err(Error::field(
                "--batch-size",
                format!("the expected batch must be in 1..={rows} (the private training rows)"),
            ));
        }
        q = b as f64 / rows as f64;
        lines.push(format!(
            "sample rate q = B/N = {b}/{rows} = {} (--batch-size is the expected batch under Poisson sampling, as in Opacus)",
            fmt_num(q)
        ));
    }
    let mut n = steps;
    if let Some(e) = flags.epochs {
        if !(e.is_finite() && e > 0.0) {
            return Err(Error::field("--epochs", format!("must be a positive number, got {e}")));
        }
        let s = (e / q).ceil();
        crate::limits::check_count("--epochs", s as u64, crate::limits::TRAIN_STEP)?;
        n = (s as usize).max(1);
        lines.push(format!("steps = ⌈E/q⌉ = ⌈{}/{}⌉ = {n}", fmt_num(e), fmt_num(q)));
    }
    let mut sigma = noise_multiplier;
    if let Some(t) = flags.target_epsilon {
        if !(t.is_finite() && t > 0.0) {
            return Err(Error::field(
                "--target-epsilon",
                format!("must be a positive number, got {t}"),
            ));
        }
        let fixed = DpSgd {
            noise_multiplier: 1.0,
            sample_rate: q,
            steps: n as u64,
        };
        let (c, why) = calibrate_dpsgd_any(
            crate::accountants::AccountantKind::Pld,
            Neighbouring::AddRemove,
            delta,
            t,
            fixed,
            SolveFor::NoiseMultiplier,
        )
        .map_err(|e| e.with_field("--target-epsilon"))?;
        sigma = c.value;
        lines.push(format!(
            "noise multiplier σ = {} calibrated for ε ≤ {} at δ = {} (q = {}, {n} steps): ε = {} ({}, {}){}",
            fmt_num(sigma),
            fmt_num(t),
            fmt_num(delta),
            fmt_num(q),
            fmt_num(c.result.epsilon),
            c.result.accountant.as_str(),
            c.result.kind.as_str(),
            why.map_or(String::new(), |w| format!("; {w}"))
        ));
    }
    Ok(OpacusResolved {
        sample_rate: q,
        steps: n,
        noise_multiplier: sigma,
        lines,
    })
}
