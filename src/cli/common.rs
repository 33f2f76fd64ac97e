//! Flags and helpers shared by several subcommands.

use crate::accountants::AccountantKind;

/// Output format of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum Format {
    #[default]
    /// Plain text for a terminal.
    Text,
    /// JSON.
    Json,
    /// CSV.
    Csv,
    /// Markdown.
    Md,
    /// Self-contained HTML.
    Html,
}

/// Parses `--accountant gdp|rdp|pld|clt|all` (comma-separated lists allowed).
pub fn parse_accountants(s: &str) -> Result<Vec<AccountantKind>, crate::Error> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.eq_ignore_ascii_case("all") {
            return Ok(AccountantKind::ALL.to_vec());
        }
        let k: AccountantKind = part.parse()?;
        if !out.contains(&k) {
            out.push(k);
        }
    }
    if out.is_empty() {
        return Err(crate::Error::field("--accountant", "no accountant given"));
    }
    Ok(out)
}
