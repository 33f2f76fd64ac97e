//! Integration tests: rdp.
