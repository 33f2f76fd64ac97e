//! Integration tests: pld.
