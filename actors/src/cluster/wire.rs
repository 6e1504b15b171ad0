//! N2: what crosses the network between the front and its nodes, and how. Only token ids,
//! sampling parameters, constraints (llguidance's grammar before compilation), session and
//! request ids go to a node; batched events, the node's load and its sessions come back.
//!
//! Every message is one JSON frame, `{"v": VERSION, "from": NODE, "msg": ...}`. The header's
//! two fields never change shape, so a peer of another protocol version is recognised (and
//! refused, with a log naming both versions) instead of misread. A frame that does not parse
//! arrives as `Unreadable` and is logged, never a panic.

use std::sync::atomic::{AtomicU64, Ordering};

use llaisys_model::{GuidanceSpec, Readout, SamplingParams};
use ractor::message::{BoxedDowncastErr, SerializedMessage};
use serde::{Deserialize, Serialize};

use crate::engine::{Event, ReplicaStats, SpeculativeStats};
use crate::host::GenerateParams;
use crate::request::{
    HarmonyParsing, ReasoningParsing, ReasoningTags, TextCallSpec, ToolCallTags, ToolParsing, XmlTools,
};
use crate::session::SessionInfo;
use llaisys_model::vision::PromptImages;

/// The message protocol's version; a peer speaking another is refused. 2: a token event leaves
/// out its empty fields; 3: read-outs (embeddings, rerank); 4: a token's log-probability only
/// where the request asked for it; 5: tool calls written as XML, with their tools' parameters;
/// 6: tool-call tags with no closing tag (Mistral's array of calls); 7: Mistral's `[ARGS]` and
/// `[CALL_ID]` tags; 8: log-probabilities of the distribution drawn from, and of the prompt;
/// a time limit on generation; 9: a request's scheduling priority; 10: a prompt's images.
pub const PROTOCOL_VERSION: u32 = 10;

/// A request as it crosses the network: everything a checked choice holds, the constraint
/// before compilation (the node checks it again against its own model and cache).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_token_ids: Vec<u32>,
    #[serde(default)]
    pub ignore_eos: bool,
    /// Tool calls' tags (open, close; none: calls are recognised in the text) and whether
    /// calling ends with `tool_calls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<(Option<ToolCallTags>, bool)>,
    /// With `tool_calls`: the calls are XML elements, read with what these tools say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xml_calls: Option<XmlTools>,
    /// The tools a call written as text may name (`tool_choice: auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_calls: Option<TextCallSpec>,
    /// The guidance of a second attempt after a rejected call written as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_retry: Option<GuidanceSpec>,
    /// Think tags (open, close) and whether the output starts inside the thinking.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<(u32, u32, bool)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harmony: Option<HarmonyParsing>,
    #[serde(default)]
    pub guidance: GuidanceSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit: Option<std::time::Duration>,
    #[serde(default)]
    pub priority: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The prompt's images, prepared by the front (the node's model is the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<PromptImages>,
}

impl WireRequest {
    pub fn new(prompt: Vec<u32>, params: &GenerateParams, session: Option<String>) -> Self {
        Self {
            prompt,
            max_tokens: params.max_tokens,
            sampling: params.sampling.clone(),
            stop: params.stop.clone(),
            stop_token_ids: params.stop_token_ids.clone(),
            ignore_eos: params.ignore_eos,
            tool_calls: params.tool_calls.as_ref().map(|t| (t.tags, t.finish_with_tool_calls)),
            xml_calls: params.tool_calls.as_ref().and_then(|t| t.xml.as_deref().cloned()),
            text_calls: params.text_calls.as_deref().cloned(),
            text_retry: params.text_retry.as_ref().map(llaisys_model::Guidance::spec),
            reasoning: params.reasoning.map(|r| (r.tags.open, r.tags.close, r.starts_open)),
            harmony: params.harmony,
            guidance: params.guidance.spec(),
            speculative: params.speculative,
            time_limit: params.time_limit,
            priority: params.priority,
            session,
            images: params.images.as_deref().cloned(),
        }
    }

    /// The parameters on the node, with the constraints compiled there (`guidance`, and
    /// `text_retry` from the spec of the same name).
    pub fn params(
        &self,
        guidance: llaisys_model::Guidance,
        text_retry: Option<llaisys_model::Guidance>,
    ) -> GenerateParams {
        GenerateParams {
            max_tokens: self.max_tokens,
            sampling: self.sampling.clone(),
            stop: self.stop.clone(),
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            tool_calls: self.tool_calls.map(|(tags, finish_with_tool_calls)| ToolParsing {
                tags,
                xml: self.xml_calls.clone().map(std::sync::Arc::new),
                finish_with_tool_calls,
            }),
            text_calls: self.text_calls.clone().map(std::sync::Arc::new),
            text_retry,
            reasoning: self.reasoning.map(|(open, close, starts_open)| ReasoningParsing {
                tags: ReasoningTags { open, close },
                starts_open,
            }),
            harmony: self.harmony,
            guidance,
            speculative: self.speculative,
            time_limit: self.time_limit,
            priority: self.priority,
            images: self.images.clone().map(std::sync::Arc::new),
        }
    }
}

/// Why a node refused a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refusal {
    pub message: String,
    /// The request field at fault (a client error), if any.
    pub param: Option<String>,
    /// The client's fault (HTTP 400) rather than the node's.
    pub client: bool,
    /// The node's `EngineError::error_type`.
    #[serde(default)]
    pub error_type: String,
    /// A client error's machine-readable code (`context_length_exceeded`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

/// A node's heartbeat: who it is, how much it takes, and its figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    /// Requests it takes at once (the front keeps at most this many in flight there).
    pub capacity: usize,
    pub model_type: String,
    pub vocab_size: usize,
    pub replicas: Vec<ReplicaStats>,
    pub sessions: Vec<SessionInfo>,
}

/// From a node to the front. `id` is the front's request id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FromNode {
    Report(NodeReport),
    Accepted {
        id: u64,
    },
    Refused {
        id: u64,
        refusal: Refusal,
    },
    /// The request's events since the last batch, in order; the last batch ends with `Finished`.
    Events {
        id: u64,
        events: Vec<Event>,
    },
    /// What a read-out gave, one vector per input, or why it failed.
    ReadOut {
        id: u64,
        result: Result<Vec<Vec<f32>>, Refusal>,
    },
}

/// From the front to a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FromFront {
    Submit {
        id: u64,
        request: Box<WireRequest>,
    },
    Cancel {
        id: u64,
    },
    DeleteSession {
        id: String,
    },
    /// Prefill-only work (embeddings, a reranker's verdicts): the checked inputs and what to
    /// read out of each.
    ReadOut {
        id: u64,
        inputs: Vec<Vec<u32>>,
        readout: Readout,
    },
}

/// A frame of this version (`Header` was read first).
#[derive(Deserialize)]
struct Frame<T> {
    from: String,
    msg: T,
}

#[derive(Serialize)]
struct FrameOut<'a, T> {
    v: u32,
    from: &'a str,
    msg: &'a T,
}

/// The part of a frame every version reads.
#[derive(Deserialize)]
struct Header {
    v: u32,
    #[serde(default)]
    from: String,
}

/// A frame as received.
#[derive(Debug, Clone, PartialEq)]
pub enum Received<T> {
    Message {
        from: String,
        msg: T,
    },
    /// A peer of another protocol version.
    Foreign {
        from: String,
        version: u32,
    },
    /// Not a frame (a bug or a corrupt peer): why.
    Unreadable(String),
}

static BYTES_SENT: AtomicU64 = AtomicU64::new(0);
static BYTES_RECEIVED: AtomicU64 = AtomicU64::new(0);

/// Frame bytes this process has sent and received over the cluster.
pub fn bytes() -> (u64, u64) {
    (BYTES_SENT.load(Ordering::Relaxed), BYTES_RECEIVED.load(Ordering::Relaxed))
}

/// Implements `ractor::Message` for an actor's message enum whose variant `$variant` holds the
/// frames from peers (`Received<T>`): only that variant crosses the network; the others (timers,
/// local calls) stay in the process.
macro_rules! wire_message {
    ($ty:ident :: $variant:ident) => {
        impl ractor::Message for $ty {
            fn serializable() -> bool {
                true
            }

            fn serialize(self) -> Result<ractor::message::SerializedMessage, ractor::message::BoxedDowncastErr> {
                match self {
                    $ty::$variant($crate::cluster::wire::Received::Message { from, msg }) => {
                        $crate::cluster::wire::encode(&from, &msg)
                    }
                    _ => Err(ractor::message::BoxedDowncastErr),
                }
            }

            fn deserialize(
                message: ractor::message::SerializedMessage,
            ) -> Result<Self, ractor::message::BoxedDowncastErr> {
                $crate::cluster::wire::decode(message).map($ty::$variant)
            }
        }
    };
}
pub(crate) use wire_message;

pub fn encode<T: Serialize>(from: &str, msg: &T) -> Result<SerializedMessage, BoxedDowncastErr> {
    let args = serde_json::to_vec(&FrameOut { v: PROTOCOL_VERSION, from, msg }).map_err(|e| {
        tracing::error!(error = %e, "a cluster message does not serialize");
        BoxedDowncastErr
    })?;
    BYTES_SENT.fetch_add(args.len() as u64, Ordering::Relaxed);
    Ok(SerializedMessage::Cast { variant: "llaisys".into(), args, metadata: None })
}

pub fn decode<T: for<'de> Deserialize<'de>>(message: SerializedMessage) -> Result<Received<T>, BoxedDowncastErr> {
    let SerializedMessage::Cast { args, .. } = message else { return Err(BoxedDowncastErr) };
    BYTES_RECEIVED.fetch_add(args.len() as u64, Ordering::Relaxed);
    Ok(parse(&args))
}

fn parse<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Received<T> {
    let header: Header = match serde_json::from_slice(bytes) {
        Ok(h) => h,
        Err(e) => return Received::Unreadable(format!("not a llaisys frame: {e}")),
    };
    if header.v != PROTOCOL_VERSION {
        return Received::Foreign { from: header.from, version: header.v };
    }
    match serde_json::from_slice::<Frame<T>>(bytes) {
        Ok(f) => Received::Message { from: f.from, msg: f.msg },
        Err(e) => Received::Unreadable(format!("a frame from '{}' does not parse: {e}", header.from)),
    }
}

/// `SpeculativeStats` as read from another node (its proposer's name owned).
#[derive(Deserialize)]
pub(crate) struct SpeculativeCounts {
    proposer: String,
    proposed: u64,
    accepted: u64,
}

impl From<SpeculativeCounts> for SpeculativeStats {
    fn from(c: SpeculativeCounts) -> Self {
        use crate::speculative::{DraftModelProposer, NgramProposer};
        let proposer = match c.proposer.as_str() {
            NgramProposer::NAME => NgramProposer::NAME,
            DraftModelProposer::NAME => DraftModelProposer::NAME,
            _ => "",
        };
        Self { proposer, proposed: c.proposed, accepted: c.accepted }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Usage;
    use crate::host::TokenLogprob;
    use crate::request::FinishReason;

    #[test]
    fn frames_round_trip() {
        let msg = FromNode::Events {
            id: 7,
            events: vec![Event::Finished {
                reason: FinishReason::Length,
                text: "é".into(),
                reasoning: "think".into(),
                usage: Usage { prompt_tokens: 3, completion_tokens: 2, cached_tokens: 1 },
                queue_time: None,
                stop: Some("\n\n".into()),
            }],
        };
        let SerializedMessage::Cast { args, .. } = encode("n1", &msg).unwrap() else { panic!("not a cast") };
        assert_eq!(parse::<FromNode>(&args), Received::Message { from: "n1".into(), msg });
    }

    #[test]
    fn a_read_out_and_its_vectors_round_trip() {
        let msg = FromFront::ReadOut {
            id: 3,
            inputs: vec![vec![1, 2], vec![3]],
            readout: Readout::Pooled(llaisys_model::Pooling::Mean),
        };
        let SerializedMessage::Cast { args, .. } = encode("front", &msg).unwrap() else { panic!("not a cast") };
        assert_eq!(parse::<FromFront>(&args), Received::Message { from: "front".into(), msg });
        // Every f32 comes back as it was.
        let vectors = vec![vec![0.1f32, -1.0e-7, 3.402_823_5e38, 1.0 / 3.0], vec![f32::MIN_POSITIVE]];
        let msg = FromNode::ReadOut { id: 3, result: Ok(vectors) };
        let SerializedMessage::Cast { args, .. } = encode("n1", &msg).unwrap() else { panic!("not a cast") };
        assert_eq!(parse::<FromNode>(&args), Received::Message { from: "n1".into(), msg });
    }

    #[test]
    fn a_token_event_carries_only_what_it_has() {
        let token = |logprob, top_logprobs: Vec<(u32, f32)>, mask_time, prompt_logprobs| Event::Token {
            token: 42,
            text: "hi".into(),
            reasoning: String::new(),
            logprob,
            top_logprobs,
            mask_time,
            tool_calls: Vec::new(),
            prompt_logprobs,
        };
        let plain = token(None, vec![], None, vec![]);
        let json = serde_json::to_string(&plain).unwrap();
        assert_eq!(json, r#"{"Token":{"token":42,"text":"hi"}}"#);
        assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), plain);
        let prompt = vec![TokenLogprob { token: 7, logprob: -3.0, top: vec![(8, -0.25)], rank: Some(2) }];
        let full = token(Some(-0.5), vec![(1, -1.0), (2, -2.0)], Some(std::time::Duration::from_micros(30)), prompt);
        let json = serde_json::to_string(&full).unwrap();
        assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), full);
    }

    #[test]
    fn another_version_is_recognised_not_misread() {
        let frame = serde_json::json!({"v": PROTOCOL_VERSION + 1, "from": "w9", "msg": {"Whatever": 1}});
        let got = parse::<FromFront>(frame.to_string().as_bytes());
        assert_eq!(got, Received::Foreign { from: "w9".into(), version: PROTOCOL_VERSION + 1 });
        assert!(matches!(parse::<FromFront>(b"\x00garbage"), Received::Unreadable(_)));
        let bad = serde_json::json!({"v": PROTOCOL_VERSION, "from": "w1", "msg": {"Cancel": {}}});
        let Received::Unreadable(why) = parse::<FromFront>(bad.to_string().as_bytes()) else { panic!("read") };
        assert!(why.contains("w1"), "{why}");
    }

    #[test]
    fn a_request_keeps_its_parameters_across() {
        let mut params =
            GenerateParams { max_tokens: 9, stop: vec!["\n".into()], priority: -4, ..GenerateParams::default() };
        params.sampling.seed = Some(5);
        let xml = XmlTools::new(&[("f", &serde_json::json!({"properties": {"n": {"type": "integer"}}}))]);
        params.tool_calls = Some(ToolParsing {
            tags: Some(ToolCallTags::pair(1, 2)),
            xml: Some(std::sync::Arc::new(xml)),
            finish_with_tool_calls: true,
        });
        let wire = WireRequest::new(vec![1, 2, 3], &params, Some("s".into()));
        let json = serde_json::to_string(&wire).unwrap();
        let back: WireRequest = serde_json::from_str(&json).unwrap();
        assert_eq!(back.params(Default::default(), None), params);
        assert_eq!(back.session.as_deref(), Some("s"));
        // A second attempt's guidance crosses as its spec, compiled again on the node.
        let retry = llaisys_model::Guidance::forbid(vec![1]).not_opening_with(vec![4, 5].into());
        params.text_retry = Some(retry.clone());
        let json = serde_json::to_string(&WireRequest::new(vec![1, 2, 3], &params, None)).unwrap();
        let back: WireRequest = serde_json::from_str(&json).unwrap();
        assert_eq!(back.text_retry, Some(retry.spec()));
    }
}
