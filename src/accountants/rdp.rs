//! Placeholder: implemented in the accounting-core work.

use super::{AccountResult, Accountant, AccountantKind};
use crate::error::{Error, Result};
use crate::events::{DpEvent, Neighbouring};

#[derive(Debug, Clone, Default)]
pub struct RdpAccountant;

impl Accountant for RdpAccountant {
    fn kind(&self) -> AccountantKind {
        AccountantKind::Rdp
    }
    fn supports(&self, _event: &DpEvent, _neighbouring: Neighbouring) -> Result<()> {
        Err(Error::unsupported("rdp: not yet implemented"))
    }
    fn epsilon(&self, _event: &DpEvent, _neighbouring: Neighbouring, _delta: f64) -> Result<AccountResult> {
        Err(Error::unsupported("rdp: not yet implemented"))
    }
    fn delta(&self, _event: &DpEvent, _neighbouring: Neighbouring, _epsilon: f64) -> Result<AccountResult> {
        Err(Error::unsupported("rdp: not yet implemented"))
    }
}
