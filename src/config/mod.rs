//! Serde schemas for user inputs (deny_unknown_fields, schema_version) with file/line/field
//! errors.

pub mod claims;
pub mod dpsgd;
pub mod sampler;
