//! Placement (D2, N2): which replica (device) or node serves a request — by session, cached
//! prefix and load — as one policy shared by a multi-device engine's placer actor and a
//! cluster's front.

mod actor;
mod messages;
mod policy;
mod prefix;

pub(crate) use actor::{PlacerActor, PlacerArgs, Target};
pub use messages::ToPlacer;
pub use policy::{Load, Placement, PlacementConfig, Reason, Routing};
pub use prefix::PrefixTree;
