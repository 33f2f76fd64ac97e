//! The one integration test binary: topic modules below (CLI through the real binary,
//! accountant conformance, reference agreement, golden reports, regressions).

mod integration {
    mod accountants;
    mod analyze;
    mod attacks;
    pub mod common;
    mod pipelines;
    mod reports;
}
