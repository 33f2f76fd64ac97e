//! models (placeholder; see ../shared/DESIGN.md).
