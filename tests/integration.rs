//! The one integration test binary: topic modules below (CLI through the real binary,
//! accountant conformance, reference agreement, golden reports, regressions).

mod integration {
    mod acceptance;
    mod accountants;
    mod analyze;
    mod attacks;
    mod check;
    mod cli_account;
    mod clt;
    pub mod common;
    mod diffusers;
    mod docs;
    mod dp_diffusers;
    mod edges;
    mod fuzz;
    mod gdp;
    mod hostile;
    mod inputs;
    mod limits_table;
    mod outputs;
    mod pipelines;
    mod pld;
    mod rdp;
    mod reports;
    mod shard;
    mod sweeps;
    mod transactions;
    mod trust;
    mod users;
    mod verdicts;
    mod white_box;
}
