//! `model info`: what a diffusers checkpoint folder holds (architecture, parameter count, file
//! hashes, scheduler), as the terminal text and the shared [`Report`] (one fact per line).

use std::path::Path;

use crate::error::Result;
use crate::models::diffusers::DiffusersCheckpoint;
use crate::report::{self, Report};

/// Loads the checkpoint at `dir` (on the CPU) and describes it.
pub fn info(dir: &Path) -> Result<super::Outcome> {
    let ck = DiffusersCheckpoint::load(dir, &candle_core::Device::Cpu)?;
    let mut text = ck.info();
    text.push_str(&dp_line(&ck)?);
    let mut r =
        Report::new(format!("dpaudit model info: {}", dir.display()), report::command_line()).for_command("model");
    for (role, p) in crate::models::diffusers_train::folder_files(dir) {
        r.add_input(role, &p)?;
    }
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(": ") {
            r.fact(k.trim(), v.trim());
        }
    }
    r.conclude();
    Ok(super::Outcome::new(r, text))
}

/// The folder's DP line: the settings and the ε its card records (with the ledger that supports
/// it and its SHA-256), that it was trained without DP, or that no dpaudit card says either.
fn dp_line(ck: &DiffusersCheckpoint) -> Result<String> {
    use crate::models::diffusers_train::{UnetCard, CARD, LEDGER};
    use crate::report::export::fmt_num as f;
    let dir = ck.config_path.parent().unwrap_or(&ck.dir);
    let Some(card) = UnetCard::load(dir)? else {
        return Ok(format!(
            "DP: not recorded (no {CARD}: trained outside dpaudit; nothing here states a DP guarantee)\n"
        ));
    };
    let Some(dp) = card.dp else {
        return Ok("DP: none (the card records a training without DP: no privacy guarantee)\n".into());
    };
    let eps = match (dp.epsilon, dp.epsilon_accountant.as_deref()) {
        (Some(e), Some(a)) => format!("ε = {} at δ = {}, {a} as the card records", f(e), f(dp.delta)),
        (Some(e), None) => format!("ε = {} at δ = {} (as the card records)", f(e), f(dp.delta)),
        _ => format!("δ = {}, ε not recorded", f(dp.delta)),
    };
    let ledger = dir.join(LEDGER);
    let sha = if ledger.is_file() {
        crate::models::data::sha256_file(&ledger)?
    } else {
        "missing".into()
    };
    Ok(format!(
        "DP: DP-SGD with noise multiplier {}, clip {}, sample rate {}, {} steps: {eps}; ledger {} sha256: {sha} (`dpaudit check {}` accounts it again)\n",
        f(dp.noise_multiplier),
        f(dp.clip),
        f(dp.sample_rate),
        dp.steps,
        dp.ledger,
        ck.dir.display()
    ))
}
