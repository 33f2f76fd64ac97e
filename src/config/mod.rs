//! config (placeholder; see ../shared/DESIGN.md).
pub mod sampler;
