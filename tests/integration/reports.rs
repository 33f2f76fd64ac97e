//! Integration tests: reports.
