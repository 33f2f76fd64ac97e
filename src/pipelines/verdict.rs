//! The shared shape of a verified claim: interpretations (a DpEvent under a neighbouring
//! relation, a σ reading and a sampling scheme), each with everything sound known about its ε
//! ([`SoundEpsilon`]: the tightest upper bound, the best lower bound, every analysis) and its
//! verdict ([`Decision`]), validity-range checks, and the claim's verdict.
//!
//! Verdict rules ([`crate::accountants::sound`]; docs/pipelines.md, "Verdicts"):
//! - per interpretation: `holds` when a sound upper bound at the claimed δ is ≤ the claimed ε,
//!   `violated` when a sound lower bound at the claimed δ exceeds it, else `not_demonstrated`;
//! - the claim's verdict is the verdict under the interpretation its paper states; the result
//!   also lists the other interpretations under which the claim holds;
//! - a claim missing a parameter is `not_demonstrated` (nothing can be accounted).

use serde::{Deserialize, Serialize};

use crate::accountants::sound::{self, Decision, Evidence, SoundEpsilon, Verdict};
use crate::events::{DpEvent, Neighbouring};

/// A reading of the claim as a DpEvent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interpretation {
    /// Stable id, e.g. `poisson_add_remove`.
    pub id: String,
    /// One sentence describing the reading.
    pub description: String,
    /// Adjacency.
    pub neighbouring: Neighbouring,
    /// The sensitivity convention in words, e.g. `Δ = 2/k`.
    pub sensitivity: String,
    /// How σ is read (e.g. `eq. (6) at the target ε`, `σ calibrated at rate m/n`); empty when
    /// the claim states σ directly.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sigma_reading: String,
    /// Sampling scheme, e.g. `Poisson q = 0.01`, `m of n without replacement`, `full batch`.
    pub sampling: String,
    /// True for the interpretation the paper itself states (it decides the claim's verdict).
    pub stated: bool,
    /// The event accounted (absent when nothing private is released).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<DpEvent>,
    /// Everything sound known about ε at the claimed δ.
    pub sound: SoundEpsilon,
    /// The verdict under this interpretation, with its evidence.
    pub decision: Decision,
}

impl Interpretation {
    /// The analysis with this method name, if computed.
    pub fn analysis(&self, method: &str) -> Option<&Evidence> {
        self.sound.analyses.iter().find(|a| a.method == method)
    }
    /// The tightest sound upper bound's ε.
    pub fn upper_epsilon(&self) -> Option<f64> {
        self.sound.upper.as_ref().map(|u| u.epsilon)
    }
}

/// Builder for an interpretation (fields as in [`Interpretation`]).
#[derive(Debug, Clone)]
pub struct InterpretationSpec {
    /// Stable id.
    pub id: String,
    /// One sentence.
    pub description: String,
    /// Sensitivity convention.
    pub sensitivity: String,
    /// σ reading.
    pub sigma_reading: String,
    /// Sampling scheme.
    pub sampling: String,
    /// The paper's own reading.
    pub stated: bool,
    /// Why the accounted event only over-approximates the mechanism (None: it is the
    /// mechanism): its numbers are then upper bounds only ([`SoundEpsilon::as_upper_bounds_of`]).
    pub over_approximates: Option<String>,
}

impl InterpretationSpec {
    /// A spec with the required texts; σ reading empty, not stated.
    pub fn new(
        id: &str,
        description: impl Into<String>,
        sensitivity: impl Into<String>,
        sampling: impl Into<String>,
    ) -> Self {
        InterpretationSpec {
            id: id.to_string(),
            description: description.into(),
            sensitivity: sensitivity.into(),
            sigma_reading: String::new(),
            sampling: sampling.into(),
            stated: false,
            over_approximates: None,
        }
    }
    /// Marks this as the paper's stated interpretation.
    pub fn stated(mut self) -> Self {
        self.stated = true;
        self
    }
    /// Marks the accounted event as an over-approximation of the mechanism (see
    /// [`InterpretationSpec::over_approximates`]).
    pub(crate) fn over_approximating(mut self, why: impl Into<String>) -> Self {
        self.over_approximates = Some(why.into());
        self
    }
    /// Sets the σ reading.
    pub(crate) fn sigma_reading(mut self, s: impl Into<String>) -> Self {
        self.sigma_reading = s.into();
        self
    }

    /// Accounts `event` with [`sound::sound_epsilon`], lets `extra` add pipeline-specific
    /// analyses (theorems, conversions), and decides the claim ε = `claimed`.
    pub fn account(
        self,
        event: DpEvent,
        neighbouring: Neighbouring,
        delta: f64,
        claimed: f64,
        extra: impl FnOnce(&mut SoundEpsilon),
    ) -> Interpretation {
        let mut s = sound::sound_epsilon(&event, neighbouring, delta);
        extra(&mut s);
        if let Some(why) = &self.over_approximates {
            s = s.as_upper_bounds_of(why);
        }
        self.finish(Some(event), s, claimed)
    }

    /// Completes the interpretation from analyses computed elsewhere.
    pub fn finish(self, event: Option<DpEvent>, s: SoundEpsilon, claimed: f64) -> Interpretation {
        let decision = s.decide(claimed);
        Interpretation {
            id: self.id,
            description: self.description,
            neighbouring: s.neighbouring,
            sensitivity: self.sensitivity,
            sigma_reading: self.sigma_reading,
            sampling: self.sampling,
            stated: self.stated,
            event,
            sound: s,
            decision,
        }
    }
}

/// A validity-range check of a formula or an assumption.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// Stable code.
    pub code: String,
    /// True when the check passes.
    pub ok: bool,
    /// What was checked and what was found.
    pub message: String,
}

impl Check {
    /// A check.
    pub fn new(code: &str, ok: bool, message: impl Into<String>) -> Self {
        Check {
            code: code.into(),
            ok,
            message: message.into(),
        }
    }
}

/// Calibration shown when the claim omits a parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// What was calibrated.
    pub what: String,
    /// Its value.
    pub value: f64,
    /// How.
    pub description: String,
}

/// How the paper's own number was produced and whether dpaudit reproduces it (for claims whose
/// number is an estimate, e.g. a CLT ε).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reproduction {
    /// The paper's number as printed.
    pub paper: f64,
    /// dpaudit's recomputation under the documented interpretation.
    pub computed: f64,
    /// What the paper's number is (`estimate` for a CLT ε).
    pub kind: crate::accountants::BoundKind,
    /// The accountant that recomputed it.
    pub accountant: crate::accountants::AccountantKind,
    /// Whether the recomputation rounds to the paper's printed digits.
    pub within_rounding: bool,
    /// The rounding used (half a unit in the last printed digit).
    pub tolerance: f64,
}

/// Everything `verify` says about one claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimResult {
    /// Claim id.
    pub id: String,
    /// `rapid`, `dp_rdm`, `dpagg_ti`, `diffusion_sampling`.
    pub pipeline: String,
    /// Paper and table.
    pub source: String,
    /// Dataset.
    pub dataset: String,
    /// Claimed ε.
    pub claimed_epsilon: f64,
    /// Claimed δ.
    pub claimed_delta: f64,
    /// The verdict under the stated interpretation.
    pub verdict: Verdict,
    /// The id of the stated interpretation (empty when none could be built).
    pub stated_interpretation: String,
    /// The number that decides the verdict (upper bound for holds, lower bound for violated,
    /// the best failing upper bound for not demonstrated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Evidence>,
    /// Why, in one sentence.
    pub reason: String,
    /// Other interpretations under which the claim holds.
    #[serde(default)]
    pub holds_under: Vec<String>,
    /// The interpretations accounted.
    pub interpretations: Vec<Interpretation>,
    /// Validity-range checks.
    pub checks: Vec<Check>,
    /// Findings worth reading.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<String>,
    /// Calibrations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calibrations: Vec<Calibration>,
    /// The paper's number recomputed (claims whose number is an estimate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reproduction: Option<Reproduction>,
}

impl ClaimResult {
    /// The interpretation with this id.
    pub fn interpretation(&self, id: &str) -> Option<&Interpretation> {
        self.interpretations.iter().find(|i| i.id == id)
    }

    /// Builds the result: the verdict is the stated interpretation's; a non-empty `missing`
    /// (parameters the paper does not give) makes it `not_demonstrated`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: &str,
        pipeline: &str,
        source: &str,
        dataset: &str,
        claimed_epsilon: f64,
        claimed_delta: f64,
        interpretations: Vec<Interpretation>,
        missing: Vec<String>,
    ) -> ClaimResult {
        let stated = interpretations.iter().find(|i| i.stated);
        let holds_under: Vec<String> = interpretations
            .iter()
            .filter(|i| !i.stated && i.decision.verdict == Verdict::Holds)
            .map(|i| i.id.clone())
            .collect();
        let (verdict, evidence, reason, stated_id) = if !missing.is_empty() {
            (
                Verdict::NotDemonstrated,
                None,
                format!("cannot be accounted: {}", missing.join("; ")),
                String::new(),
            )
        } else if let Some(i) = stated {
            (
                i.decision.verdict,
                i.decision.evidence.clone(),
                format!("under `{}`: {}", i.id, i.decision.reason),
                i.id.clone(),
            )
        } else {
            (
                Verdict::NotDemonstrated,
                None,
                "no interpretation the paper states could be accounted".to_string(),
                String::new(),
            )
        };
        ClaimResult {
            id: id.to_string(),
            pipeline: pipeline.to_string(),
            source: source.to_string(),
            dataset: dataset.to_string(),
            claimed_epsilon,
            claimed_delta,
            verdict,
            stated_interpretation: stated_id,
            evidence,
            reason,
            holds_under,
            interpretations,
            checks: Vec::new(),
            findings: Vec::new(),
            calibrations: Vec::new(),
            reproduction: None,
        }
    }

    /// One line: the verdict, its evidence, and where else the claim holds.
    pub fn describe(&self) -> String {
        let mut s = format!("{}: {}", self.verdict, self.reason);
        if !self.holds_under.is_empty() && self.verdict != Verdict::Holds {
            s.push_str(&format!("; holds under {}", self.holds_under.join(", ")));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accountants::BoundKind;

    fn interp(id: &str, stated: bool, upper: f64, lower: Option<f64>) -> Interpretation {
        let mut s = SoundEpsilon::empty(Neighbouring::AddRemove, 1e-5);
        s.push(Evidence::new("rdp", upper, 1e-5, BoundKind::UpperBound));
        if let Some(l) = lower {
            s.push(Evidence::new("delta_floor", l, 1e-5, BoundKind::LowerBound));
        }
        let mut spec = InterpretationSpec::new(id, "", "", "");
        spec.stated = stated;
        spec.finish(None, s, 5.0)
    }

    #[test]
    fn the_stated_interpretation_decides_and_others_are_listed() {
        let r = ClaimResult::new(
            "c",
            "x",
            "",
            "",
            5.0,
            1e-5,
            vec![interp("paper", true, 7.0, None), interp("alt", false, 3.0, None)],
            vec![],
        );
        assert_eq!(r.verdict, Verdict::NotDemonstrated);
        assert_eq!(r.holds_under, vec!["alt".to_string()]);
        let r = ClaimResult::new(
            "c",
            "x",
            "",
            "",
            5.0,
            1e-5,
            vec![interp("paper", true, 9.0, Some(6.0))],
            vec![],
        );
        assert_eq!(r.verdict, Verdict::Violated);
        assert_eq!(r.evidence.unwrap().kind, BoundKind::LowerBound);
        let r = ClaimResult::new(
            "c",
            "x",
            "",
            "",
            5.0,
            1e-5,
            vec![interp("paper", true, 4.0, None)],
            vec!["σ".into()],
        );
        assert_eq!(r.verdict, Verdict::NotDemonstrated);
    }
}
