//! Published pipelines (RAPID, DP-RDM, DPAgg-TI): their claims mapped to [`DpEvent`]s under
//! each plausible interpretation, verdicts from sound accountants only ([`verdict`]), and
//! executable mechanisms with ledgers and empirical audits ([`mechanisms`], [`audit`]).
//!
//! ```text
//! claims.toml ─► config::claims ─► rapid / dp_rdm / dpagg_ti ─► DpEvent per interpretation
//!                                                   └─► accountants (gdp, rdp, pld) ─► verdict::decide
//! embeddings ─► mechanisms::{dpagg_ti, dp_rdm} ─► output + ledger (EventFile) ─► verify / check
//!                      └─► audit (sensitivity, distinguishing ─► attacks::audit ε lower bound)
//! ```

pub mod audit;
pub mod dp_rdm;
pub mod dpagg_ti;
pub mod embeddings;
pub mod mechanisms;
pub mod rapid;
pub mod verdict;

use crate::config::claims::ClaimsFile;
use crate::error::Result;
use crate::events::{DpEvent, Neighbouring};

pub use verdict::{ClaimResult, Verdict};

/// RDP ε with the classic conversion ε = min_α RDP(α) + ln(1/δ)/(α − 1) (Mironov 2017, Prop. 3),
/// or None when the RDP accountant cannot account `event`.
pub fn rdp_classic_epsilon(event: &DpEvent, neighbouring: Neighbouring, delta: f64) -> Option<f64> {
    use crate::accountants::{convert::Conversion, rdp::RdpAccountant, Accountant};
    let acc = RdpAccountant::default().with_conversion(Conversion::Classic);
    acc.supports(event, neighbouring).ok()?;
    acc.epsilon(event, neighbouring, delta).ok().map(|r| r.epsilon)
}

/// Verifies every claim of a file, in file order (RAPID, then DP-RDM, then DPAgg-TI tables).
/// Claims are independent, so they are verified in parallel (rayon; results keep file order).
pub fn verify_claims(file: &ClaimsFile) -> Result<Vec<ClaimResult>> {
    use rayon::prelude::*;
    let mut out: Vec<ClaimResult> = file.rapid.par_iter().map(rapid::verify).collect::<Result<_>>()?;
    out.extend(file.dp_rdm.par_iter().map(dp_rdm::verify).collect::<Result<Vec<_>>>()?);
    out.extend(file.dpagg_ti.par_iter().map(dpagg_ti::verify).collect::<Result<Vec<_>>>()?);
    Ok(out)
}
