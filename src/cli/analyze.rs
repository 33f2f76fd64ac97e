//! `dpaudit analyze` (placeholder).

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<i32> {
    Err(crate::Error::input("`analyze` is not yet implemented").into())
}
