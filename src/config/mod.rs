//! config (placeholder; see ../shared/DESIGN.md).
