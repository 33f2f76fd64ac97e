//! Integration tests: clt.
