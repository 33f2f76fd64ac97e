//! Serde schemas for user inputs (deny_unknown_fields, schema_version) with file/line/field
//! errors.

pub mod claims;
pub mod dpsgd;
/// Sampler configurations are diffusion-domain inputs: they live in [`crate::diffusion::sampler`].
pub use crate::diffusion::sampler;
