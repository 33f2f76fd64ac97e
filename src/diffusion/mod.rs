//! diffusion (placeholder; see ../shared/DESIGN.md).
