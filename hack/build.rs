//! Empty: cargo resolves a package's build-dependencies only where it has a build script, and
//! this crate's are there for their features alone (see Cargo.toml).
fn main() {}
