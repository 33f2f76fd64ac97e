//! The white-box audit of an observed DP-SGD run against its ledger (`dpaudit.opacus` through
//! `api::white_box_audit`): the estimators of `attacks::white_box` on the noisy updates seen at
//! the gradient canaries, and the verdict against the ledger's smallest sound ε.

use serde::Serialize;

use crate::accountants::sound;
use crate::accountants::sound::sound_epsilon;
use crate::attacks::white_box::{LedgerMechanism, WhiteBoxAudit};
use crate::error::{Error, Result};
use crate::events::Neighbouring;

/// [`audit`]'s answer.
#[derive(Debug, Clone, Serialize)]
pub struct WhiteBoxVerdict {
    /// `fail` when an estimator's ε lower bound exceeds the ledger's smallest sound ε (the
    /// implementation does not deliver its ledger), `pass` when none does, `inconclusive` when
    /// no sound accountant bounds the ledger's ε — the rule of an audit verdict in a `mia` report.
    #[serde(with = "sound::status_word")]
    pub status: sound::Verdict,
    /// The ledger's smallest sound ε at δ.
    pub ledger_epsilon: Option<f64>,
    /// The accountant that gives it.
    pub ledger_accountant: Option<String>,
    /// Every estimator's result (threat model: white-box).
    pub audit: WhiteBoxAudit,
}

/// Audits `observations` ([steps, m] row-major, m = `included.len()` canaries, in units of the
/// clip bound) against the ledger `mechanism` at δ with the estimators' `confidence`.
pub fn audit(
    observations: &[f32],
    included: &[bool],
    mechanism: LedgerMechanism,
    delta: f64,
    confidence: f64,
) -> Result<WhiteBoxVerdict> {
    let m = included.len();
    if m == 0 || !observations.len().is_multiple_of(m) {
        return Err(Error::field(
            "observations",
            format!("{} values are not whole steps of {m} canaries", observations.len()),
        ));
    }
    let steps = observations.len() / m;
    if steps as u64 != mechanism.steps {
        return Err(Error::field(
            "steps",
            format!(
                "the ledger says {} steps, the observations hold {steps}",
                mechanism.steps
            ),
        ));
    }
    let audit = crate::attacks::white_box::audit(observations, steps, included, &mechanism, delta, confidence)?;
    let event = mechanism.event(mechanism.noise_multiplier);
    let sound = sound_epsilon(&event, Neighbouring::AddRemove, delta);
    let ledger = sound.upper.as_ref().map(|u| (u.epsilon, u.source().to_string()));
    let status = match &ledger {
        Some((e, _)) if audit.epsilon_lower > *e => sound::Verdict::Violated,
        Some(_) => sound::Verdict::Holds,
        None => sound::Verdict::NotDemonstrated,
    };
    Ok(WhiteBoxVerdict {
        status,
        ledger_epsilon: ledger.as_ref().map(|l| l.0),
        ledger_accountant: ledger.map(|l| l.1),
        audit,
    })
}
