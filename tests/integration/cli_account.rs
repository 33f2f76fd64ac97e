//! Integration tests: cli_account.
