//! `account`: ε(δ) (or δ(ε)) of one event by every requested accountant, as the shared report
//! (the [`super::audit`] chain), the terminal table and `account.csv`.

use crate::config::dpsgd::Derived;
use crate::error::{Error, Result};
use crate::report::progress::Progress;

/// A validated `account` request.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The audit chain's plan (input, question, accountants).
    pub audit: super::Plan,
    /// The DP-SGD run in users' words the event was derived from (epochs, batch, dataset size).
    pub derived: Option<Derived>,
}

/// `account`: runs the audit chain; fails (unsupported) when no accountant supports the event.
pub fn execute(plan: &Plan, progress: &Progress) -> Result<super::Outcome> {
    let mut rep = super::audit(&plan.audit, progress)?;
    if let Some(d) = &plan.derived {
        rep.fact("steps", d.steps.to_string())
            .fact("sample rate q", crate::report::num::fmt(d.sample_rate));
        for l in &d.derivation {
            rep.assumptions
                .other
                .push(crate::report::Fact::new("DP-SGD derivation", l.clone()));
        }
    }
    if rep.results.is_empty() {
        let reasons: Vec<String> = rep
            .skipped
            .iter()
            .map(|u| format!("{}: {}", u.accountant.as_str(), u.reason))
            .collect();
        return Err(Error::unsupported(format!(
            "no accountant supports this event:\n  {}",
            reasons.join("\n  ")
        )));
    }
    let mut text = String::new();
    if let Some(d) = &plan.derived {
        text.push_str(&format!("DP-SGD run: {}\n", d.summary()));
        for l in &d.derivation {
            text.push_str(&format!("  {l}\n"));
        }
    }
    text.push_str(&super::text::account(&rep));
    let csv = super::text::account_csv(&rep)?;
    Ok(super::Outcome::new(rep, text).with_table("account.csv", csv))
}
