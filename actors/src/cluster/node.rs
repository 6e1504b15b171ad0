//! A node's actor (N2): it runs the front's requests on this node's engine and streams their
//! events back in batches. It is a member of the `node/NAME` process group (how the front finds
//! it), reports its load and sessions every heartbeat interval, and follows the front's group:
//! when the front goes (its connection closed), every request of it is dropped here, which
//! cancels them in the engine and frees their KV cells.

use std::collections::HashMap;
use std::time::Duration;

use llaisys_model::{Guidance, GuidanceSpec};
use ractor::pg::GroupChangeMessage;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::front::ToFront;
use super::wire::{self, FromFront, FromNode, NodeReport, PROTOCOL_VERSION, Received, Refusal, WireRequest};
use super::{FRONT_GROUP, SCOPE, node_group};
use crate::engine::{Engine, EngineError, Event};
use crate::host::{GenerateRequest, RequestError};

/// Events sent in one message at most (a batch holds what arrived since the last one).
const MAX_BATCH: usize = 64;

/// To a node's actor.
pub enum ToNode {
    /// From the front.
    Front(Received<FromFront>),
    /// A request's stream ended here.
    Done(u64),
    /// The heartbeat timer.
    Tick,
}

wire::wire_message!(ToNode::Front);

pub struct NodeActor;

pub struct NodeArgs {
    pub engine: Engine,
    /// The node's name (unique in the cluster).
    pub name: String,
    /// Requests it takes at once: the front keeps no more in flight here.
    pub capacity: usize,
    pub heartbeat_interval: Duration,
}

struct Running {
    cancel: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

pub struct NodeState {
    args: NodeArgs,
    front: Option<ActorRef<ToFront>>,
    running: HashMap<u64, Running>,
}

impl Actor for NodeActor {
    type Msg = ToNode;
    type State = NodeState;
    type Arguments = NodeArgs;

    async fn pre_start(&self, myself: ActorRef<ToNode>, args: NodeArgs) -> Result<NodeState, ActorProcessingErr> {
        ractor::pg::join_scoped(SCOPE.into(), node_group(&args.name), vec![myself.get_cell()]);
        ractor::pg::monitor_scope(SCOPE.into(), myself.get_cell());
        myself.send_interval(args.heartbeat_interval, || ToNode::Tick);
        let front = ractor::pg::get_scoped_members(&SCOPE.into(), &FRONT_GROUP.into()).into_iter().next();
        Ok(NodeState { args, front: front.map(ActorRef::from), running: HashMap::new() })
    }

    async fn handle(
        &self,
        myself: ActorRef<ToNode>,
        msg: ToNode,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ToNode::Front(Received::Message { msg, .. }) => match msg {
                FromFront::Submit { id, request } => state.submit(myself, id, *request),
                FromFront::Cancel { id } => {
                    if let Some(cancel) = state.running.get_mut(&id).and_then(|r| r.cancel.take()) {
                        let _ = cancel.send(());
                    }
                }
                FromFront::DeleteSession { id } => {
                    let _ = state.args.engine.delete_session(&id).await;
                }
                FromFront::ReadOut { id, inputs, readout } => state.read_out(id, inputs, readout),
            },
            ToNode::Front(Received::Foreign { from, version }) => {
                let why = format!(
                    "the front '{from}' speaks cluster protocol v{version}, this node v{PROTOCOL_VERSION}: leaving"
                );
                tracing::error!("{why}");
                myself.stop(Some(why));
            }
            ToNode::Front(Received::Unreadable(why)) => tracing::warn!("unreadable cluster message: {why}"),
            ToNode::Done(id) => {
                state.running.remove(&id);
            }
            ToNode::Tick => state.report().await,
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _: ActorRef<ToNode>,
        event: SupervisionEvent,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ProcessGroupChanged(change) = event {
            match change {
                GroupChangeMessage::Join(_, group, cells) if group == FRONT_GROUP => {
                    if let Some(cell) = cells.into_iter().next() {
                        tracing::info!("joined the front");
                        state.front = Some(ActorRef::from(cell));
                        state.report().await;
                    }
                }
                GroupChangeMessage::Leave(_, group, cells) if group == FRONT_GROUP => {
                    let ours = state.front.as_ref().is_some_and(|f| cells.iter().any(|c| c.get_id() == f.get_id()));
                    if ours {
                        state.front = None;
                        let dropped = state.running.len();
                        for (_, r) in state.running.drain() {
                            r.task.abort(); // drops the stream: the engine cancels the request
                        }
                        tracing::warn!(dropped, "the front is gone; its requests here were dropped");
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    async fn post_stop(&self, _: ActorRef<ToNode>, state: &mut NodeState) -> Result<(), ActorProcessingErr> {
        for (_, r) in state.running.drain() {
            r.task.abort();
        }
        Ok(())
    }
}

impl NodeState {
    async fn report(&mut self) {
        let Some(front) = &self.front else { return };
        let engine = &self.args.engine;
        let (Ok(mut replicas), Ok(sessions)) = (engine.replica_stats().await, engine.sessions().await) else {
            return; // the engine is stopping
        };
        for r in &mut replicas {
            r.node = self.args.name.clone();
        }
        let info = engine.info();
        let report = NodeReport {
            capacity: self.args.capacity,
            model_type: info.model_type.into(),
            vocab_size: info.vocab_size,
            replicas,
            sessions,
        };
        let _ = front.send_message(message(&self.args.name, FromNode::Report(report)));
    }

    fn submit(&mut self, myself: ActorRef<ToNode>, id: u64, request: WireRequest) {
        let Some(front) = self.front.clone() else { return };
        let name = self.args.name.clone();
        let engine = self.args.engine.clone();
        let (cancel, cancelled) = oneshot::channel();
        let task = tokio::spawn(async move {
            run(&engine, &front, &name, id, request, cancelled).await;
            let _ = myself.send_message(ToNode::Done(id));
        });
        self.running.insert(id, Running { cancel: Some(cancel), task });
    }

    /// Runs a read-out on the engine's workers and sends its vectors (or why not) back. Nothing
    /// streams and nothing stays, so there is nothing to cancel: a front that went away drops
    /// the answer.
    fn read_out(&mut self, id: u64, inputs: Vec<Vec<u32>>, readout: llaisys_model::Readout) {
        let Some(front) = self.front.clone() else { return };
        let (name, engine) = (self.args.name.clone(), self.args.engine.clone());
        tokio::spawn(async move {
            let result = engine.read_out(&inputs, readout).await.map_err(|e| refusal(&e));
            let _ = front.send_message(message(&name, FromNode::ReadOut { id, result }));
        });
    }
}

/// Runs one of the front's requests and forwards its events, batched, until it finishes.
async fn run(
    engine: &Engine,
    front: &ActorRef<ToFront>,
    name: &str,
    id: u64,
    request: WireRequest,
    mut cancelled: oneshot::Receiver<()>,
) {
    let send = |msg| front.send_message(message(name, msg)).is_ok();
    let retry = request.text_retry.as_ref().map(|spec| compile(engine, spec)).transpose();
    let generate = match compile(engine, &request.guidance).and_then(|g| Ok((g, retry?))) {
        Ok((guidance, text_retry)) => {
            let params = request.params(guidance, text_retry);
            engine.generate(GenerateRequest { prompt: request.prompt, params, session: request.session }).await
        }
        Err(e) => Err(e),
    };
    let mut stream = match generate {
        Ok(stream) => stream,
        Err(e) => {
            send(FromNode::Refused { id, refusal: refusal(&e) });
            return;
        }
    };
    if !send(FromNode::Accepted { id }) {
        return;
    }
    let mut listening = true;
    loop {
        let first = tokio::select! {
            event = stream.next() => event,
            asked = &mut cancelled, if listening => {
                listening = false;
                if asked.is_ok() {
                    engine.cancel(stream.id).await;
                }
                continue;
            }
        };
        let Some(first) = first else { return };
        let mut finished = matches!(first, Event::Finished { .. });
        let mut events = vec![first];
        while !finished && events.len() < MAX_BATCH {
            let Some(event) = stream.try_next() else { break };
            finished = matches!(event, Event::Finished { .. });
            events.push(event);
        }
        if !send(FromNode::Events { id, events }) || finished {
            return;
        }
    }
}

/// The front's constraint, compiled for this node's model.
fn compile(engine: &Engine, spec: &GuidanceSpec) -> Result<Guidance, EngineError> {
    if *spec == GuidanceSpec::default() {
        return Ok(Guidance::default());
    }
    let compiler = engine.frontend().grammar_compiler()?;
    Ok(compiler.guidance(spec).map_err(|e| RequestError::invalid("constraint", e.0))?)
}

fn refusal(e: &EngineError) -> Refusal {
    let (param, code) = match e {
        EngineError::Request(r) => (r.param.clone(), r.code.map(String::from)),
        _ => (None, None),
    };
    let (client, error_type) = (e.is_client_error(), e.error_type().to_string());
    Refusal { message: e.to_string(), param, client, error_type, code }
}

fn message(from: &str, msg: FromNode) -> ToFront {
    ToFront::Node(Received::Message { from: from.into(), msg })
}
