//! Test-only support (being written).
