//! The shared shape of a verified claim: interpretations (a DpEvent under a neighbouring
//! relation and a sensitivity convention), the analyses of each (accountants and closed forms,
//! each labelled sound or not), validity-range checks, and one verdict.
//!
//! Verdict rules (only sound numbers decide):
//! - an interpretation's ε is the smallest ε among its **sound** analyses (each is a valid upper
//!   bound, so the smallest is too); it holds when that ε ≤ the claimed ε;
//! - all interpretations hold → `holds` (margin = claimed − the largest of their ε);
//! - some hold → `holds_only_under` (naming them, and by how much the others miss);
//! - none holds → `violated` (by the smallest excess);
//! - an interpretation with no sound number, or a claim missing a parameter → `undecided`.

use serde::{Deserialize, Serialize};

use crate::accountants::{AccountantKind, BoundKind};
use crate::events::{DpEvent, Neighbouring};

/// One way of computing ε for an interpretation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    /// Short method name, e.g. `pld`, `rdp`, `rdp_classic_conversion`, `rapid_theorem1`.
    pub method: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// The accountant behind the number, if any.
    pub accountant: Option<AccountantKind>,
    /// ε of this analysis.
    pub epsilon: f64,
    /// δ of this analysis.
    pub delta: f64,
    /// Kind of the number.
    pub kind: BoundKind,
    /// True when this number is a valid upper bound on ε for the interpretation (its kind is
    /// sound *and* its preconditions hold). Only sound analyses enter verdicts.
    pub sound: bool,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    /// Explanation shown with the number.
    pub note: String,
}

impl Analysis {
    /// An analysis named `method`.
    pub fn new(method: &str, epsilon: f64, delta: f64, kind: BoundKind, sound: bool) -> Self {
        Analysis {
            method: method.to_string(),
            accountant: None,
            epsilon,
            delta,
            kind,
            sound,
            note: String::new(),
        }
    }
    /// Adds an explanation.
    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }
}

/// A reading of the claim as a DpEvent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interpretation {
    /// Stable id, e.g. `poisson_add_remove`.
    pub id: String,
    /// What the interpretation assumes, in words.
    pub description: String,
    /// Neighbouring relation assumed.
    pub neighbouring: Neighbouring,
    /// The sensitivity convention in words, e.g. `Δ = 2/k`.
    pub sensitivity: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// The event, when the interpretation has one.
    pub event: Option<DpEvent>,
    /// Ways of computing ε for it.
    pub analyses: Vec<Analysis>,
    /// Accountants that could not account the event, with their reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
}

impl Interpretation {
    /// Smallest ε among sound analyses, or None when no sound analysis exists.
    pub fn sound_epsilon(&self) -> Option<f64> {
        self.analyses
            .iter()
            .filter(|a| a.sound && !a.epsilon.is_nan())
            .map(|a| a.epsilon)
            .fold(None, |acc: Option<f64>, e| Some(acc.map_or(e, |a| a.min(e))))
    }
    /// The analysis giving [`Self::sound_epsilon`].
    pub fn best(&self) -> Option<&Analysis> {
        self.analyses
            .iter()
            .filter(|a| a.sound)
            .min_by(|a, b| a.epsilon.total_cmp(&b.epsilon))
    }
    /// The analysis named `method`.
    pub fn analysis(&self, method: &str) -> Option<&Analysis> {
        self.analyses.iter().find(|a| a.method == method)
    }
}

/// A validity-range check of a formula or an assumption.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// Machine-readable name.
    pub code: String,
    /// Whether the check passed.
    pub ok: bool,
    /// What was checked and found.
    pub message: String,
}

impl Check {
    /// A check result.
    pub fn new(code: &str, ok: bool, message: impl Into<String>) -> Self {
        Check {
            code: code.into(),
            ok,
            message: message.into(),
        }
    }
}

/// The verdict on one claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// A sound ε is within the claim under every interpretation.
    Holds {
        /// Claimed ε minus the largest sound ε over the interpretations.
        margin: f64,
    },
    /// The claim holds only under some interpretations.
    HoldsOnlyUnder {
        /// Ids of the interpretations under which it holds.
        interpretations: Vec<String>,
        /// (interpretation, its sound ε − claimed ε) for those that fail.
        fails: Vec<(String, f64)>,
    },
    /// Under every interpretation the sound ε exceeds the claim.
    Violated {
        /// Smallest excess of a sound ε over the claim.
        by: f64,
        /// The smallest sound ε over the interpretations.
        best_epsilon: f64,
    },
    /// Some interpretation has no sound ε, or the claim lacks a parameter.
    Undecided {
        /// What is missing, in words.
        missing: Vec<String>,
    },
}

impl Verdict {
    /// Short label (`holds`, `holds_only_under`, `violated`, `undecided`).
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Holds { .. } => "holds",
            Verdict::HoldsOnlyUnder { .. } => "holds_only_under",
            Verdict::Violated { .. } => "violated",
            Verdict::Undecided { .. } => "undecided",
        }
    }
    /// True for [`Verdict::Violated`].
    pub fn is_violated(&self) -> bool {
        matches!(self, Verdict::Violated { .. })
    }
    /// One line of text.
    pub fn describe(&self) -> String {
        match self {
            Verdict::Holds { margin } => format!("holds (margin {margin:.4})"),
            Verdict::HoldsOnlyUnder { interpretations, fails } => {
                let f: Vec<String> = fails.iter().map(|(i, by)| format!("{i} misses by {by:.4}")).collect();
                format!("holds only under {} ({})", interpretations.join(", "), f.join("; "))
            }
            Verdict::Violated { by, best_epsilon } => {
                format!("violated by {by:.4} (best sound ε = {best_epsilon:.4})")
            }
            Verdict::Undecided { missing } => format!("cannot be decided: {}", missing.join("; ")),
        }
    }
}

/// Calibration shown when the claim omits a parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// The parameter calibrated.
    pub what: String,
    /// The calibrated value.
    pub value: f64,
    /// How it was calibrated.
    pub description: String,
}

/// Everything `verify` says about one claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimResult {
    /// Identifier of the claim.
    pub id: String,
    /// Pipeline (`rapid`, `dp_rdm`, `dpagg_ti`).
    pub pipeline: String,
    /// Where the claim is published.
    pub source: String,
    /// Dataset the claim is about.
    pub dataset: String,
    /// Claimed ε.
    pub claimed_epsilon: f64,
    /// Claimed δ.
    pub claimed_delta: f64,
    /// The verdict.
    pub verdict: Verdict,
    /// Each reading of the claim with its analyses.
    pub interpretations: Vec<Interpretation>,
    /// Validity-range checks.
    pub checks: Vec<Check>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    /// Notable findings in words.
    pub findings: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    /// Calibrations for parameters the claim omits.
    pub calibrations: Vec<Calibration>,
}

impl ClaimResult {
    /// The interpretation with id `id`.
    pub fn interpretation(&self, id: &str) -> Option<&Interpretation> {
        self.interpretations.iter().find(|i| i.id == id)
    }
}

/// Applies the verdict rules of this module.
pub fn decide(claimed: f64, interpretations: &[Interpretation], missing: Vec<String>) -> Verdict {
    if !missing.is_empty() {
        return Verdict::Undecided { missing };
    }
    let mut holds = Vec::new();
    let mut fails = Vec::new();
    let mut undecided = Vec::new();
    for i in interpretations {
        match i.sound_epsilon() {
            Some(e) if e <= claimed => holds.push((i.id.clone(), e)),
            Some(e) => fails.push((i.id.clone(), e - claimed)),
            None => undecided.push(format!(
                "no sound accountant for `{}` ({})",
                i.id,
                i.unavailable.join("; ")
            )),
        }
    }
    if !undecided.is_empty() {
        return Verdict::Undecided { missing: undecided };
    }
    if fails.is_empty() {
        let worst = holds.iter().map(|(_, e)| *e).fold(f64::NEG_INFINITY, f64::max);
        Verdict::Holds {
            margin: claimed - worst,
        }
    } else if holds.is_empty() {
        let by = fails.iter().map(|(_, d)| *d).fold(f64::INFINITY, f64::min);
        Verdict::Violated {
            by,
            best_epsilon: claimed + by,
        }
    } else {
        Verdict::HoldsOnlyUnder {
            interpretations: holds.into_iter().map(|(i, _)| i).collect(),
            fails,
        }
    }
}

/// Accounts `event` with every sound accountant (GDP exact, RDP, PLD) through the
/// [`crate::accountants::Accountant`] trait. Accountants that do not support the event are
/// listed in `unavailable` with their reason; the CLT estimate is never used for verdicts.
pub fn account_sound(event: &DpEvent, neighbouring: Neighbouring, delta: f64) -> (Vec<Analysis>, Vec<String>) {
    let mut out = Vec::new();
    let mut unavailable = Vec::new();
    for kind in [AccountantKind::Gdp, AccountantKind::Rdp, AccountantKind::Pld] {
        let acc = kind.build();
        if let Err(e) = acc.supports(event, neighbouring) {
            // GDP is exact only for full-batch Gaussians; its absence elsewhere is expected.
            if kind != AccountantKind::Gdp {
                unavailable.push(strip_prefix(kind, &e.message));
            }
            continue;
        }
        match acc.epsilon(event, neighbouring, delta) {
            Ok(r) => {
                let mut a = Analysis::new(kind.as_str(), r.epsilon, r.delta, r.kind, r.kind.is_sound());
                a.accountant = Some(kind);
                if let Some(order) = r.details.get("rdp_order").or_else(|| r.details.get("order")) {
                    a.note = format!("optimal order α = {order:.4}");
                }
                out.push(a);
            }
            Err(e) => unavailable.push(strip_prefix(kind, &e.message)),
        }
    }
    (out, unavailable)
}

/// "kind: message" without repeating the kind when the message already starts with it.
pub fn strip_prefix(kind: AccountantKind, message: &str) -> String {
    let k = kind.as_str();
    if message.starts_with(&format!("{k}:")) {
        message.to_string()
    } else {
        format!("{k}: {message}")
    }
}

/// Builds an interpretation accounted by every sound accountant.
pub fn interpretation(
    id: &str,
    description: impl Into<String>,
    sensitivity: impl Into<String>,
    event: DpEvent,
    neighbouring: Neighbouring,
    delta: f64,
) -> Interpretation {
    let (analyses, unavailable) = account_sound(&event, neighbouring, delta);
    Interpretation {
        id: id.to_string(),
        description: description.into(),
        neighbouring,
        sensitivity: sensitivity.into(),
        event: Some(event),
        analyses,
        unavailable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interp(id: &str, eps: &[(f64, bool)]) -> Interpretation {
        Interpretation {
            id: id.into(),
            description: String::new(),
            neighbouring: Neighbouring::AddRemove,
            sensitivity: String::new(),
            event: None,
            analyses: eps
                .iter()
                .map(|&(e, s)| Analysis::new("x", e, 1e-5, BoundKind::UpperBound, s))
                .collect(),
            unavailable: vec![],
        }
    }

    #[test]
    fn verdict_rules() {
        let a = interp("a", &[(3.0, true), (2.0, true), (0.1, false)]);
        let b = interp("b", &[(12.0, true)]);
        assert_eq!(a.sound_epsilon(), Some(2.0));
        assert_eq!(
            decide(5.0, std::slice::from_ref(&a), vec![]),
            Verdict::Holds { margin: 3.0 }
        );
        match decide(5.0, &[a.clone(), b.clone()], vec![]) {
            Verdict::HoldsOnlyUnder { interpretations, fails } => {
                assert_eq!(interpretations, vec!["a".to_string()]);
                assert_eq!(fails, vec![("b".to_string(), 7.0)]);
            }
            v => panic!("{v:?}"),
        }
        assert_eq!(
            decide(1.0, &[a.clone(), b], vec![]),
            Verdict::Violated {
                by: 1.0,
                best_epsilon: 2.0
            }
        );
        // An estimate-only interpretation cannot decide.
        let c = interp("c", &[(0.1, false)]);
        assert!(matches!(decide(5.0, &[c], vec![]), Verdict::Undecided { .. }));
        assert!(matches!(
            decide(5.0, &[a], vec!["sigma".into()]),
            Verdict::Undecided { .. }
        ));
    }
}
