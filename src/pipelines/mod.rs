//! Published pipelines (plain DP-SGD, RAPID, DP-RDM, DPAgg-TI, diffusion sampling): their claims mapped to [`DpEvent`]s under
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
pub mod diffusion_sampling;
pub mod dp_rdm;
pub mod dp_sgd;
pub mod dpagg_ti;
pub mod embeddings;
pub mod mechanisms;
pub mod rapid;
pub mod verdict;

use crate::config::claims::ClaimsFile;
use crate::error::Result;
use crate::events::{DpEvent, Neighbouring};

pub use crate::accountants::sound::Verdict;
pub use verdict::ClaimResult;

/// RDP ε with the classic conversion ε = min_α RDP(α) + ln(1/δ)/(α − 1) (Mironov 2017, Prop. 3),
/// or None when the RDP accountant cannot account `event`.
pub(crate) fn rdp_classic_epsilon(event: &DpEvent, neighbouring: Neighbouring, delta: f64) -> Option<f64> {
    use crate::accountants::{convert::Conversion, rdp::RdpAccountant, Accountant};
    let acc = RdpAccountant::default().with_conversion(Conversion::Classic);
    acc.supports(event, neighbouring).ok()?;
    acc.epsilon(event, neighbouring, delta).ok().map(|r| r.epsilon)
}

/// Verifies every claim of a file, in file order (DP-SGD, RAPID, DP-RDM, DPAgg-TI, then diffusion-sampling
/// tables). Claims are independent, so they are verified in parallel (rayon; results keep file
/// order).
pub fn verify_claims(file: &ClaimsFile) -> Result<Vec<ClaimResult>> {
    verify_claims_with(file, &|| {})
}

/// [`verify_claims`], calling `done` once per verified claim (for progress by claim).
pub(crate) fn verify_claims_with(file: &ClaimsFile, done: &(dyn Fn() + Sync)) -> Result<Vec<ClaimResult>> {
    use rayon::prelude::*;
    fn each<C: Sync>(
        claims: &[C],
        f: fn(&C) -> Result<ClaimResult>,
        done: &(dyn Fn() + Sync),
    ) -> Result<Vec<ClaimResult>> {
        claims
            .par_iter()
            .map(|c| {
                let r = f(c);
                done();
                r
            })
            .collect()
    }
    let mut out = each(&file.dp_sgd, dp_sgd::verify, done)?;
    out.extend(each(&file.rapid, rapid::verify, done)?);
    out.extend(each(&file.dp_rdm, dp_rdm::verify, done)?);
    out.extend(each(&file.dpagg_ti, dpagg_ti::verify, done)?);
    out.extend(each(&file.diffusion_sampling, diffusion_sampling::verify, done)?);
    Ok(out)
}
