//! Placeholder: the workload suite lands with the performance issue.
fn main() {}
