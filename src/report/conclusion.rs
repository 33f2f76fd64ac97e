//! The plain-language conclusion every report opens with: what was audited, the guarantee,
//! the verdict, and which numbers are estimates rather than guarantees.

use serde::{Deserialize, Serialize};

use super::export::fmt_num;
use super::{Report, Status};
use crate::accountants::BoundKind;

/// Four sentences a reviewer reads first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conclusion {
    /// What was audited.
    pub audited: String,
    /// The guarantee shown (a sound bound), or that none was shown.
    pub guarantee: String,
    /// The verdict on the budget or claims, or that none was checked.
    pub verdict: String,
    /// Which numbers are estimates or measurements, not guarantees.
    pub estimates: String,
}

fn kind_words(k: BoundKind) -> &'static str {
    match k {
        BoundKind::Exact => "an exact value",
        BoundKind::UpperBound => "an upper bound",
        BoundKind::Estimate => "an estimate",
        BoundKind::LowerBound => "a lower bound",
        BoundKind::DataDependent => "a data-dependent number (not a DP guarantee)",
    }
}

/// Derives the conclusion from a report's content (used for reports whose command did not
/// write its own, and for upgraded version 1 files).
pub fn derive(r: &Report) -> Conclusion {
    let audited = if r.inputs.is_empty() {
        format!("{}.", r.title.trim_end_matches('.'))
    } else {
        let inputs: Vec<String> = r.inputs.iter().map(|i| format!("{} `{}`", i.role, i.path)).collect();
        format!("{} (from {}).", r.title.trim_end_matches('.'), inputs.join(", "))
    };
    let nb = r
        .assumptions
        .neighbouring
        .map(|n| format!(" for {n} neighbouring datasets"))
        .unwrap_or_default();
    let guarantee = match r.sound_epsilon() {
        Some(s) => format!(
            "The pipeline is (ε = {}, δ = {})-differentially private{nb}: {} from the {} accountant.",
            fmt_num(s.epsilon),
            fmt_num(s.delta),
            kind_words(s.kind),
            s.accountant.as_str()
        ),
        None if r.event.is_some() => {
            "No guarantee was shown: no sound accountant (exact value or upper bound) could account this event.".into()
        }
        None if !r.verdicts.is_empty() => {
            "Each subject's guarantee is judged below against sound bounds (exact values and upper bounds) only.".into()
        }
        None => "This report computes no privacy guarantee.".into(),
    };
    let verdict = match r.verdicts.as_slice() {
        [] => "No budget or claim was checked, so there is no verdict.".into(),
        [v] => format!("{}: {}", v.status.as_str(), v.message.trim_end_matches('.')) + ".",
        vs => {
            let n = |s: Status| vs.iter().filter(|v| v.status == s).count();
            format!(
                "{} subjects: {} PASS, {} FAIL, {} INCONCLUSIVE (not demonstrated either way).",
                vs.len(),
                n(Status::Pass),
                n(Status::Fail),
                n(Status::Inconclusive)
            )
        }
    };
    let estimates: Vec<String> = r
        .results
        .iter()
        .filter(|x| matches!(x.kind, BoundKind::Estimate | BoundKind::DataDependent))
        .map(|x| format!("{} (ε = {})", x.accountant.as_str(), fmt_num(x.epsilon)))
        .collect();
    let estimates = if estimates.is_empty() {
        if r.results.is_empty() {
            "No accountant numbers appear in this report.".into()
        } else {
            "Every accountant number here is an exact value or an upper bound; none is an estimate.".into()
        }
    } else {
        format!(
            "{} {} an estimate, not a guarantee, and never decides a verdict.",
            estimates.join(", "),
            if estimates.len() == 1 { "is" } else { "are each" }
        )
    };
    Conclusion {
        audited,
        guarantee,
        verdict,
        estimates,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accountants::{AccountResult, AccountantKind};

    #[test]
    fn names_the_sound_bound_and_the_estimate() {
        let mut r = Report::new("Privacy budget check: x.toml", "dpaudit check x.toml");
        r.results
            .push(AccountResult::new(AccountantKind::Clt, 0.5, 1e-5, BoundKind::Estimate));
        r.results.push(AccountResult::new(
            AccountantKind::Pld,
            0.8,
            1e-5,
            BoundKind::UpperBound,
        ));
        let c = derive(&r);
        assert!(
            c.guarantee.contains("ε = 0.8") && c.guarantee.contains("pld"),
            "{}",
            c.guarantee
        );
        assert!(c.estimates.contains("clt (ε = 0.5) is an estimate"), "{}", c.estimates);
        assert!(c.verdict.contains("no verdict"), "{}", c.verdict);
    }
}
