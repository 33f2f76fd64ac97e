//! Which shard of a sharded attack this process scores (`mia --shard i/n`): shared by the scoring
//! pipeline (which records are this shard's) and the part files ([`super::shard`]).

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The most shards one run may be cut into.
pub const MAX_SHARDS: usize = 100_000;

/// Shard `index` of `count` (0-based), as written `i/n` on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardSpec {
    /// This shard, 0 ≤ index < count.
    pub index: usize,
    /// Number of shards.
    pub count: usize,
}

impl ShardSpec {
    /// Whether the record at `position` of the unsharded record list is this shard's
    /// (round robin: position mod count = index, so shards get equal shares of every set).
    pub fn owns(&self, position: usize) -> bool {
        position % self.count == self.index
    }

    /// The part file's name: `mia-part-<i>-of-<n>.json`.
    pub fn file_name(&self) -> String {
        format!("mia-part-{}-of-{}.json", self.index, self.count)
    }
}

impl FromStr for ShardSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::field(
                "--shard",
                format!("expected i/n with 0 ≤ i < n ≤ {MAX_SHARDS} (e.g. 0/4), got `{s}`"),
            )
        };
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: usize = i.trim().parse().map_err(|_| bad())?;
        let count: usize = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || count > MAX_SHARDS || index >= count {
            return Err(bad());
        }
        Ok(ShardSpec { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_specs_parse_and_refuse() {
        assert_eq!("3/8".parse::<ShardSpec>().unwrap(), ShardSpec { index: 3, count: 8 });
        for bad in ["8/8", "1/0", "x/2", "1", "-1/4", "0/100001"] {
            let e = bad.parse::<ShardSpec>().unwrap_err();
            assert_eq!(e.field.as_deref(), Some("--shard"), "{bad}");
        }
        let s = ShardSpec { index: 1, count: 4 };
        let owned: Vec<usize> = (0..10).filter(|&p| s.owns(p)).collect();
        assert_eq!(owned, vec![1, 5, 9]);
        assert_eq!(s.file_name(), "mia-part-1-of-4.json");
    }
}
