//! Integration tests: accountants.
