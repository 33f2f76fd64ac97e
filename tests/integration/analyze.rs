//! Integration tests: analyze.
