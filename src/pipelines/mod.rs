//! pipelines (placeholder; see ../shared/DESIGN.md).
