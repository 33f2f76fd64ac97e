//! Integration tests: check.
