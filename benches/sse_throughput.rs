//! Placeholder until the throughput bench lands.
fn main() {}
