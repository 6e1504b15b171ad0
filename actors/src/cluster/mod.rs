//! N1–N5: several machines. A front (`llaisys serve --cluster-listen ADDR`) routes requests to
//! worker nodes (`llaisys worker --join ADDR`), each a whole engine, over ractor_cluster.
//!
//! - `wire.rs`: the messages that cross the network (token ids, parameters, constraints, ids;
//!   batched events back), in versioned frames;
//! - `front.rs`: the front's router actor: nodes, their reports and in-flight requests, the
//!   queue, placement (`crate::placement`, shared with multi-device engines), node loss;
//! - `node.rs`: a node's actor, running the front's requests on its engine;
//! - `transport.rs`: the node servers (cookie, TLS), the worker's connection with backoff.
//!
//! The front may serve a model itself: its own engine then joins as one more node (a local
//! actor in the same process groups, whose messages are never serialized).

pub mod front;
pub mod node;
pub mod transport;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef};
use ractor_cluster::NodeServerMessage;

use crate::engine::Engine;
use crate::host::Frontend;
use crate::placement::PlacementConfig;
pub use front::ToFront;
use front::{FrontActor, FrontArgs};
pub use node::ToNode;
use node::{NodeActor, NodeArgs};
pub use transport::{ClusterError, Tls, read_cookie};

/// The process-group scope of llaisys' actors.
pub const SCOPE: &str = "llaisys";
/// The front's router joins this group.
pub const FRONT_GROUP: &str = "front";
/// Each node's actor joins `node/NAME`.
pub const NODE_GROUP_PREFIX: &str = "node/";

/// The process group of the node named `name`.
pub(crate) fn node_group(name: &str) -> String {
    format!("{NODE_GROUP_PREFIX}{name}")
}

/// The cluster's settings (`[cluster]` in the server's config).
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This process's node name (unique in the cluster).
    pub name: String,
    /// How often a node reports its load.
    pub heartbeat_interval: Duration,
    /// A node silent this long leaves the pool.
    pub heartbeat_timeout: Duration,
    /// Requests the front holds while every node is at capacity (beyond: overloaded).
    pub queue: usize,
    /// Requests a node takes at once (its advertised capacity).
    pub capacity: usize,
    pub placement: PlacementConfig,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            name: default_name(),
            heartbeat_interval: Duration::from_millis(500),
            heartbeat_timeout: Duration::from_secs(3),
            queue: 256,
            capacity: 64,
            placement: PlacementConfig::default(),
        }
    }
}

/// `HOSTNAME-PID`: unique per process on a machine.
pub fn default_name() -> String {
    let host = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "node".into());
    format!("{host}-{}", std::process::id())
}

/// A running front: its router, its node server and, when it serves a model itself, its own
/// engine's node actor.
pub(crate) struct FrontParts {
    pub front: ActorRef<ToFront>,
    server: ActorRef<NodeServerMessage>,
    local: Option<(Engine, ActorRef<ToNode>)>,
}

impl FrontParts {
    pub(crate) async fn shutdown(&self) {
        let _ = ractor::call!(self.front, ToFront::Shutdown);
        if let Some((engine, node)) = &self.local {
            node.stop(None);
            Box::pin(engine.shutdown()).await; // a local engine: no recursion beyond one level
        }
        self.front.stop(None);
        self.server.stop(None);
    }
}

/// Starts a front listening on `listen` for worker nodes, and returns the engine handle that
/// routes over them, checking requests with `frontend` (the model's sizes, tokenizer, template
/// and limits; the nodes check again against their caches). With `local`, the front's own
/// engine runs requests as one of the nodes (named `config.name`).
pub async fn start_front(
    frontend: Arc<Frontend>,
    local: Option<Engine>,
    listen: SocketAddr,
    cookie: String,
    tls: Option<Tls>,
    config: ClusterConfig,
) -> Result<Engine, ClusterError> {
    let server = transport::listen(&config.name, cookie, listen, tls).await?;
    let args = FrontArgs { config: config.clone(), vocab_size: frontend.info().vocab_size };
    let (front, _) = Actor::spawn(None, FrontActor, args)
        .await
        .map_err(|e| ClusterError::Spawn { actor: "front's router", reason: e.to_string() })?;
    let local = match local {
        Some(engine) => Some((engine.clone(), start_node(engine, &config).await?.0)),
        None => None,
    };
    let parts = Arc::new(FrontParts { front, server, local });
    Ok(Engine::routed(frontend, parts))
}

/// Starts this process's node actor over `engine` (a worker's, or the front's own).
async fn start_node(
    engine: Engine,
    config: &ClusterConfig,
) -> Result<(ActorRef<ToNode>, tokio::task::JoinHandle<()>), ClusterError> {
    let args = NodeArgs {
        engine,
        name: config.name.clone(),
        capacity: config.capacity,
        heartbeat_interval: config.heartbeat_interval,
    };
    Actor::spawn(None, NodeActor, args)
        .await
        .map_err(|e| ClusterError::Spawn { actor: "node actor", reason: e.to_string() })
}

/// A worker node: its engine, its node actor and its connection to the front.
pub struct Worker {
    engine: Engine,
    node: ActorRef<ToNode>,
    ended: tokio::task::JoinHandle<()>,
    server: ActorRef<NodeServerMessage>,
    joining: tokio::task::JoinHandle<()>,
}

impl Worker {
    /// Waits until the node leaves by itself (a front of another protocol version).
    pub async fn left(&mut self) {
        let _ = (&mut self.ended).await;
    }

    /// Leaves the cluster (its requests here end) and shuts the engine down.
    pub async fn shutdown(self) {
        self.joining.abort();
        self.node.stop(None);
        self.server.stop(None);
        self.engine.shutdown().await;
    }
}

/// Joins the front at `front` (HOST:PORT) as a worker node running requests on `engine`; the
/// connection is kept, and made again with backoff when lost.
pub async fn join(
    engine: Engine,
    front: String,
    cookie: String,
    tls: Option<Tls>,
    config: &ClusterConfig,
) -> Result<Worker, ClusterError> {
    // Nodes dial the front, never each other: this listener only completes ractor_cluster's
    // node server.
    let server = transport::listen(&config.name, cookie, SocketAddr::from(([127, 0, 0, 1], 0)), None).await?;
    let (node, ended) = start_node(engine.clone(), config).await?;
    let joining = tokio::spawn(transport::stay_joined(server.clone(), front, tls));
    Ok(Worker { engine, node, ended, server, joining })
}
