//! No code: this crate's dependencies set the features that the workspace's default build and
//! its wgpu build share, so that either build's compiled crates serve the other (see its
//! Cargo.toml).
