//! The front's router actor (N2–N5): it owns the cluster's view — the nodes that joined, their
//! last reports, the requests in flight on each and the front's own queue — and the placement
//! policy (`crate::placement`, the same one a multi-device engine uses), keyed by node name.
//!
//! - A node is a member of the `node/NAME` process group; it becomes routable with its first
//!   report (heartbeat) and leaves when its group empties (its connection closed) or when no
//!   report came for `heartbeat_timeout` (a stalled node whose connection stayed open comes back
//!   with its next report).
//! - A request waits in the queue until a node has room below its advertised capacity; when
//!   the queue is full too, it is refused (`EngineError::Overloaded`, HTTP 429). The queue is
//!   ordered by the requests' priorities (lower first), then arrival.
//! - When a node leaves, its requests that streamed nothing go back to the head of the queue
//!   (and run elsewhere); the others end with `FinishReason::Error`.
//! - Read-outs (embeddings, a reranker's verdicts) queue beside the requests and go whole to
//!   the node with room and the fewest in flight; one whose node leaves runs again elsewhere
//!   (nothing of it streamed).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use ractor::pg::GroupChangeMessage;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::mpsc::UnboundedSender;

use super::node::ToNode;
use super::wire::{self, FromFront, FromNode, NodeReport, PROTOCOL_VERSION, Received, Refusal, WireRequest};
use super::{ClusterConfig, FRONT_GROUP, NODE_GROUP_PREFIX, SCOPE, node_group};
use crate::engine::{EngineError, Event, NodeFailure, ReplicaStats, Usage};
use crate::host::RequestError;
use crate::placement::{Load, Placement};
use crate::request::{FinishReason, RequestId};
use crate::scheduler::{Submission, enqueue_by_priority};
use crate::session::SessionInfo;
use llaisys_model::Readout;

/// To the front's router.
pub enum ToFront {
    /// From a node (over the network, or the front's own local node).
    Node(Received<FromNode>),
    /// `Engine::generate` on the front: place and forward the request.
    Submit(Submission),
    Cancel {
        id: RequestId,
        reply: RpcReplyPort<bool>,
    },
    /// `Engine::embed` and `Engine::rerank` on the front: prefill-only work for one node.
    ReadOut {
        inputs: Vec<Vec<u32>>,
        readout: Readout,
        reply: RpcReplyPort<Result<Vec<Vec<f32>>, EngineError>>,
    },
    /// Every node's replicas, from their last reports.
    Stats(RpcReplyPort<Vec<ReplicaStats>>),
    Sessions(RpcReplyPort<Vec<SessionInfo>>),
    DeleteSession {
        id: String,
        reply: RpcReplyPort<bool>,
    },
    /// Refuse new requests; reply once none is in flight.
    Shutdown(RpcReplyPort<()>),
    /// The router's timer: heartbeat timeouts and abandoned requests.
    Tick,
}

wire::wire_message!(ToFront::Node);

pub struct FrontActor;

pub struct FrontArgs {
    pub config: ClusterConfig,
    /// The model's vocabulary: a node serving another is refused.
    pub vocab_size: usize,
}

/// A node as the front sees it.
struct Node {
    actor: ActorRef<ToNode>,
    /// The last report; `None` until the first (not routable before).
    report: Option<NodeReport>,
    last_seen: Instant,
    in_flight: usize,
}

impl Node {
    fn live(&self) -> bool {
        self.report.is_some()
    }

    /// Whether it takes another request: below the capacity its last report advertised.
    fn has_room(&self) -> bool {
        self.report.as_ref().is_some_and(|r| self.in_flight < r.capacity)
    }
}

struct Pending {
    request: Box<WireRequest>,
    events: UnboundedSender<Event>,
    /// `Engine::generate`'s answer, until the node accepts or refuses.
    reply: Option<RpcReplyPort<Result<RequestId, EngineError>>>,
    node: Option<String>,
    streamed: bool,
    cancelled: bool,
}

/// A read-out the front holds: queued (`node` none) or running on a node.
struct PendingReadOut {
    inputs: Vec<Vec<u32>>,
    readout: Readout,
    reply: RpcReplyPort<Result<Vec<Vec<f32>>, EngineError>>,
    node: Option<String>,
}

pub struct FrontState {
    config: ClusterConfig,
    vocab_size: usize,
    nodes: BTreeMap<String, Node>,
    /// Names refused (another protocol version, another model), logged once each.
    refused: HashSet<String>,
    placement: Placement<String>,
    pending: HashMap<RequestId, Pending>,
    queue: VecDeque<RequestId>,
    read_outs: HashMap<RequestId, PendingReadOut>,
    read_queue: VecDeque<RequestId>,
    next_id: RequestId,
    shutdown: Option<RpcReplyPort<()>>,
    draining: bool,
}

impl Actor for FrontActor {
    type Msg = ToFront;
    type State = FrontState;
    type Arguments = FrontArgs;

    async fn pre_start(&self, myself: ActorRef<ToFront>, args: FrontArgs) -> Result<FrontState, ActorProcessingErr> {
        ractor::pg::join_scoped(SCOPE.into(), FRONT_GROUP.into(), vec![myself.get_cell()]);
        ractor::pg::monitor_scope(SCOPE.into(), myself.get_cell());
        myself.send_interval(args.config.heartbeat_interval / 2, || ToFront::Tick);
        let mut state = FrontState {
            placement: Placement::new(args.config.placement),
            config: args.config,
            vocab_size: args.vocab_size,
            nodes: BTreeMap::new(),
            refused: HashSet::new(),
            pending: HashMap::new(),
            queue: VecDeque::new(),
            read_outs: HashMap::new(),
            read_queue: VecDeque::new(),
            next_id: 0,
            shutdown: None,
            draining: false,
        };
        for group in ractor::pg::which_scoped_groups(&SCOPE.into()) {
            let members = ractor::pg::get_scoped_members(&SCOPE.into(), &group);
            state.joined(&group, members);
        }
        Ok(state)
    }

    async fn handle(
        &self,
        _: ActorRef<ToFront>,
        msg: ToFront,
        state: &mut FrontState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ToFront::Node(Received::Message { from, msg }) => state.node_message(from, msg),
            ToFront::Node(Received::Foreign { from, version }) => {
                if state.refused.insert(from.clone()) {
                    tracing::error!(
                        node = from,
                        "refused node '{from}': it speaks cluster protocol v{version}, this front v{PROTOCOL_VERSION}"
                    );
                }
            }
            ToFront::Node(Received::Unreadable(why)) => tracing::warn!("unreadable cluster message: {why}"),
            ToFront::Submit(submission) => state.submit(submission),
            ToFront::ReadOut { inputs, readout, reply } => state.read_out(inputs, readout, reply),
            ToFront::Cancel { id, reply } => {
                let _ = reply.send(state.cancel(id));
            }
            ToFront::Stats(reply) => {
                let replicas = state.reports().flat_map(|(_, r)| r.replicas.iter().cloned()).collect();
                let _ = reply.send(replicas);
            }
            ToFront::Sessions(reply) => {
                let mut all: Vec<SessionInfo> = state.reports().flat_map(|(_, r)| r.sessions.iter().cloned()).collect();
                all.sort_by(|a, b| a.id.cmp(&b.id));
                let _ = reply.send(all);
            }
            ToFront::DeleteSession { id, reply } => {
                let _ = reply.send(state.delete_session(&id));
            }
            ToFront::Shutdown(reply) => {
                state.draining = true;
                for id in std::mem::take(&mut state.queue) {
                    state.finish(id, FinishReason::Abort);
                }
                for id in std::mem::take(&mut state.read_queue) {
                    if let Some(r) = state.read_outs.remove(&id) {
                        let _ = r.reply.send(Err(EngineError::ShuttingDown));
                    }
                }
                state.shutdown = Some(reply);
                state.check_drained();
            }
            ToFront::Tick => state.tick(),
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _: ActorRef<ToFront>,
        event: SupervisionEvent,
        state: &mut FrontState,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ProcessGroupChanged(change) = event {
            match change {
                GroupChangeMessage::Join(_, group, cells) => state.joined(&group, cells),
                GroupChangeMessage::Leave(_, group, cells) => {
                    if let Some(name) = group.strip_prefix(NODE_GROUP_PREFIX)
                        && state.nodes.get(name).is_some_and(|n| cells.iter().any(|c| c.get_id() == n.actor.get_id()))
                    {
                        state.remove(name, "its connection closed");
                    }
                }
            }
        }
        Ok(())
    }
}

impl FrontState {
    fn joined(&mut self, group: &str, cells: Vec<ractor::ActorCell>) {
        let Some(name) = group.strip_prefix(NODE_GROUP_PREFIX) else { return };
        let Some(cell) = cells.into_iter().next() else { return };
        if let Some(existing) = self.nodes.get(name)
            && existing.actor.get_id() != cell.get_id()
        {
            tracing::error!(node = name, "refused a second node named '{name}': node names must differ");
            return;
        }
        let actor = ActorRef::<ToNode>::from(cell);
        tracing::info!(node = name, "node connected; routable after its first report");
        self.nodes.insert(name.into(), Node { actor, report: None, last_seen: Instant::now(), in_flight: 0 });
    }

    fn reports(&self) -> impl Iterator<Item = (&String, &NodeReport)> {
        self.nodes.iter().filter_map(|(name, n)| n.report.as_ref().map(|r| (name, r)))
    }

    fn node_message(&mut self, from: String, msg: FromNode) {
        match msg {
            FromNode::Report(report) => self.report(from, report),
            FromNode::Accepted { id } => {
                if let Some(reply) = self.pending.get_mut(&id).and_then(|p| p.reply.take()) {
                    let _ = reply.send(Ok(id));
                }
            }
            FromNode::Refused { id, refusal } => {
                if let Some(p) = self.take(id) {
                    let error = refused(&from, refusal);
                    match p.reply {
                        Some(reply) => {
                            let _ = reply.send(Err(error));
                        }
                        None => tracing::error!(request = id, "refused after acceptance: {error}"),
                    }
                }
                self.dispatch();
            }
            FromNode::Events { id, events } => self.events(&from, id, events),
            FromNode::ReadOut { id, result } => {
                if self.read_outs.get(&id).is_some_and(|r| r.node.as_deref() == Some(from.as_str())) {
                    let r = self.take_read_out(id).expect("held");
                    let _ = r.reply.send(result.map_err(|refusal| refused(&from, refusal)));
                }
                self.dispatch();
            }
        }
    }

    fn report(&mut self, from: String, report: NodeReport) {
        if report.vocab_size != self.vocab_size {
            if self.refused.insert(from.clone()) {
                tracing::error!(
                    node = from,
                    "refused node '{from}': its model has {} tokens, this front's {}",
                    report.vocab_size,
                    self.vocab_size
                );
            }
            return;
        }
        if !self.nodes.contains_key(&from) {
            // Removed for silence while its connection stayed open (a stalled process that
            // resumed): it is still in its group, so it comes back.
            let group = node_group(&from);
            let members = ractor::pg::get_scoped_members(&SCOPE.into(), &group);
            self.joined(&group, members);
        }
        let Some(node) = self.nodes.get_mut(&from) else {
            tracing::warn!(node = from, "a report from a node that is not connected");
            return;
        };
        if node.report.is_none() {
            tracing::info!(node = from, capacity = report.capacity, model = report.model_type, "node joined");
        }
        node.report = Some(report);
        node.last_seen = Instant::now();
        self.dispatch();
    }

    fn events(&mut self, from: &str, id: RequestId, events: Vec<Event>) {
        let Some(p) = self.pending.get_mut(&id).filter(|p| p.node.as_deref() == Some(from)) else {
            // A request the front gave up on (its node timed out, then came back): stop it there.
            if let Some(node) = self.nodes.get(from) {
                send(&node.actor, &self.config.name, FromFront::Cancel { id });
            }
            return;
        };
        let mut finished = false;
        for event in events {
            finished |= matches!(event, Event::Finished { .. });
            p.streamed |= matches!(event, Event::Token { .. });
            if p.events.send(event).is_err() && !p.cancelled {
                p.cancelled = true; // the client went away
                if let Some(node) = self.nodes.get(from) {
                    send(&node.actor, &self.config.name, FromFront::Cancel { id });
                }
            }
        }
        if finished {
            self.take(id);
            self.dispatch();
        }
    }

    fn read_out(
        &mut self,
        inputs: Vec<Vec<u32>>,
        readout: Readout,
        reply: RpcReplyPort<Result<Vec<Vec<f32>>, EngineError>>,
    ) {
        if self.draining {
            let _ = reply.send(Err(EngineError::ShuttingDown));
            return;
        }
        let queued = self.queue.len() + self.read_queue.len();
        if !self.nodes.values().any(Node::has_room) && queued >= self.config.queue {
            let nodes = self.nodes.values().filter(|n| n.live()).count();
            let _ = reply.send(Err(EngineError::Overloaded { nodes, queued }));
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.read_outs.insert(id, PendingReadOut { inputs, readout, reply, node: None });
        self.read_queue.push_back(id);
        self.dispatch();
    }

    fn submit(&mut self, submission: Submission) {
        let Submission { choice, events, reply } = submission;
        if self.draining {
            let _ = reply.send(Err(EngineError::ShuttingDown));
            return;
        }
        let room = self.nodes.values().any(Node::has_room);
        if !room && self.queue.len() >= self.config.queue {
            let nodes = self.nodes.values().filter(|n| n.live()).count();
            let _ = reply.send(Err(EngineError::Overloaded { nodes, queued: self.queue.len() }));
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        let wire = Box::new(WireRequest::new(choice.prompt, &choice.params, choice.session));
        let pending =
            Pending { request: wire, events, reply: Some(reply), node: None, streamed: false, cancelled: false };
        self.pending.insert(id, pending);
        self.enqueue(id, false);
        self.dispatch();
        if self.queue.contains(&id) {
            tracing::debug!(request = id, queued = self.queue.len(), "request queued: no node has room");
        }
    }

    /// Queues pending request `id` by its priority (`first`: ahead of its own priority's).
    fn enqueue(&mut self, id: RequestId, first: bool) {
        let pending = &self.pending;
        enqueue_by_priority(&mut self.queue, id, |id| pending.get(id).map_or(0, |p| p.request.priority), first);
    }

    /// Sends queued requests, then read-outs, oldest first, while a node has room.
    fn dispatch(&mut self) {
        self.dispatch_requests();
        self.dispatch_read_outs();
    }

    fn dispatch_requests(&mut self) {
        while let Some(&id) = self.queue.front() {
            let loads: Vec<(String, Load)> = self
                .nodes
                .iter()
                .filter(|(_, n)| n.live())
                .map(|(name, n)| (name.clone(), Load { requests: n.in_flight, available: n.has_room() }))
                .collect();
            let p = self.pending.get(&id).expect("a queued request is pending");
            let Some((name, reason)) = self.placement.place(&p.request.prompt, p.request.session.as_deref(), &loads)
            else {
                return;
            };
            self.queue.pop_front();
            tracing::debug!(request = id, node = name, reason = reason.as_str(), "request placed");
            let node = self.nodes.get_mut(&name).expect("placed on a known node");
            node.in_flight += 1;
            let p = self.pending.get_mut(&id).expect("pending");
            p.node = Some(name.clone());
            let submit = FromFront::Submit { id, request: p.request.clone() };
            if !send(&node.actor, &self.config.name, submit) {
                self.remove(&name, "it cannot be reached");
            }
        }
    }

    /// Each queued read-out goes whole to the node with room and the fewest in flight.
    fn dispatch_read_outs(&mut self) {
        while let Some(&id) = self.read_queue.front() {
            let least = self.nodes.iter().filter(|(_, n)| n.has_room()).min_by_key(|(_, n)| n.in_flight);
            let Some(name) = least.map(|(name, _)| name.clone()) else { return };
            self.read_queue.pop_front();
            let node = self.nodes.get_mut(&name).expect("a known node");
            node.in_flight += 1;
            let r = self.read_outs.get_mut(&id).expect("a queued read-out is held");
            r.node = Some(name.clone());
            let msg = FromFront::ReadOut { id, inputs: r.inputs.clone(), readout: r.readout.clone() };
            if !send(&node.actor, &self.config.name, msg) {
                self.remove(&name, "it cannot be reached");
            }
        }
    }

    /// A read-out leaves the front's books; its node's slot is free again.
    fn take_read_out(&mut self, id: RequestId) -> Option<PendingReadOut> {
        let r = self.read_outs.remove(&id)?;
        self.free_slot(r.node.as_deref());
        Some(r)
    }

    /// Work that ran on `node` left the front's books.
    fn free_slot(&mut self, node: Option<&str>) {
        if let Some(node) = node.and_then(|n| self.nodes.get_mut(n)) {
            node.in_flight = node.in_flight.saturating_sub(1);
        }
        self.check_drained();
    }

    /// A request leaves the front's books; its node's slot is free again.
    fn take(&mut self, id: RequestId) -> Option<Pending> {
        let p = self.pending.remove(&id)?;
        self.free_slot(p.node.as_deref());
        Some(p)
    }

    /// Ends a request at the front (its node is gone, or it never left the queue).
    fn finish(&mut self, id: RequestId, reason: FinishReason) {
        let Some(p) = self.take(id) else { return };
        match p.reply {
            Some(reply) if reason == FinishReason::Error => {
                let node = p.node.clone().unwrap_or_default();
                let _ = reply.send(Err(EngineError::Node { node, reason: NodeFailure::Left }));
            }
            Some(reply) if self.draining => {
                let _ = reply.send(Err(EngineError::ShuttingDown));
            }
            // Cancelled before a node took it: it ends like any cancelled request, with `abort`.
            reply => {
                if let Some(reply) = reply {
                    let _ = reply.send(Ok(id));
                }
                let usage = Usage { prompt_tokens: p.request.prompt.len(), ..Usage::default() };
                let _ = p.events.send(Event::Finished {
                    reason,
                    text: String::new(),
                    reasoning: String::new(),
                    usage,
                    queue_time: None,
                    stop: None,
                });
            }
        }
    }

    fn remove(&mut self, name: &str, why: &str) {
        let Some(node) = self.nodes.remove(name) else { return };
        self.placement.remove(&name.to_string());
        let on_it: Vec<RequestId> =
            self.pending.iter().filter(|(_, p)| p.node.as_deref() == Some(name)).map(|(id, _)| *id).collect();
        let (mut retried, mut failed) = (0, 0);
        for id in on_it {
            let p = self.pending.get_mut(&id).expect("pending");
            if p.streamed || p.cancelled {
                failed += 1;
                self.finish(id, FinishReason::Error);
            } else {
                retried += 1;
                p.node = None;
                self.enqueue(id, true);
            }
        }
        // Read-outs streamed nothing: they run again elsewhere.
        let mut read_outs: Vec<RequestId> =
            self.read_outs.iter().filter(|(_, r)| r.node.as_deref() == Some(name)).map(|(id, _)| *id).collect();
        read_outs.sort_unstable_by(|a, b| b.cmp(a));
        for id in read_outs {
            self.read_outs.get_mut(&id).expect("held").node = None;
            self.read_queue.push_front(id);
            retried += 1;
        }
        tracing::warn!(node = name, retried, failed, in_flight = node.in_flight, "node removed: {why}");
        self.dispatch();
    }

    fn cancel(&mut self, id: RequestId) -> bool {
        let Some(p) = self.pending.get_mut(&id) else { return false };
        match p.node.as_ref().and_then(|n| self.nodes.get(n)) {
            Some(node) => {
                p.cancelled = true;
                send(&node.actor, &self.config.name, FromFront::Cancel { id });
            }
            None => {
                self.queue.retain(|q| *q != id);
                self.finish(id, FinishReason::Abort);
            }
        }
        true
    }

    fn delete_session(&mut self, id: &str) -> bool {
        let mut existed = self.placement.session_target(id).is_some();
        self.placement.forget_session(id);
        for node in self.nodes.values_mut() {
            if let Some(report) = &mut node.report {
                existed |= report.sessions.iter().any(|s| s.id == id);
                report.sessions.retain(|s| s.id != id);
                send(&node.actor, &self.config.name, FromFront::DeleteSession { id: id.into() });
            }
        }
        existed
    }

    fn tick(&mut self) {
        let timeout = self.config.heartbeat_timeout;
        let silent: Vec<(String, Duration)> = self
            .nodes
            .iter()
            .map(|(name, n)| (name.clone(), n.last_seen.elapsed()))
            .filter(|(_, quiet)| *quiet > timeout)
            .collect();
        for (name, quiet) in silent {
            self.remove(&name, &format!("no heartbeat for {} ms", quiet.as_millis()));
        }
        // Clients that went away: a queued request is dropped, a running one cancelled.
        let gone: Vec<RequestId> = self
            .pending
            .iter()
            .filter(|(_, p)| !p.cancelled && (p.events.is_closed() || p.reply.as_ref().is_some_and(|r| r.is_closed())))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.cancel(id);
        }
        // Read-outs whose caller went away before a node took them.
        let read_outs = &mut self.read_outs;
        self.read_queue.retain(|id| {
            let gone = read_outs.get(id).is_none_or(|r| r.reply.is_closed());
            if gone {
                read_outs.remove(id);
            }
            !gone
        });
        self.check_drained();
    }

    fn check_drained(&mut self) {
        if self.pending.is_empty()
            && self.read_outs.is_empty()
            && let Some(reply) = self.shutdown.take()
        {
            let _ = reply.send(());
        }
    }
}

/// Sends to a node; false if its actor is gone.
fn send(node: &ActorRef<ToNode>, from: &str, msg: FromFront) -> bool {
    node.send_message(ToNode::Front(Received::Message { from: from.into(), msg })).is_ok()
}

/// A node's refusal as the front's error: the request's fault as it was, the node's own as a
/// node failure.
fn refused(node: &str, r: Refusal) -> EngineError {
    if !r.client {
        let reason = NodeFailure::Refused { error_type: r.error_type, message: r.message };
        return EngineError::Node { node: node.into(), reason };
    }
    let mut error = RequestError::general(r.message);
    error.param = r.param;
    error.code = r.code.as_deref().and_then(RequestError::known_code);
    error.into()
}
