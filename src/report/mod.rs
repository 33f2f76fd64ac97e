//! report (placeholder; see ../shared/DESIGN.md).
