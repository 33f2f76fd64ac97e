//! attacks (placeholder; see ../shared/DESIGN.md).
