//! Integration tests: attacks.
