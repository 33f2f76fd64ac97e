//! `dpaudit sweep` (placeholder).

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<i32> {
    Err(crate::Error::input("`sweep` is not yet implemented").into())
}
