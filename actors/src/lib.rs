//! llaisys-actors: the engine over the model core (DESIGN.md E1–E10), and the API a host
//! application embeds it through.
//!
//! # Embedding
//!
//! Build an engine from a GGUF file or a Hugging Face directory inside your tokio runtime,
//! then chat with it. The model's own chat template, tokenizer and generation defaults apply,
//! exactly as through the HTTP server (which translates OpenAI JSON into these same calls).
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use llaisys_actors::{ChatRequest, Engine};
//! # let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tiny-tied-f32");
//!
//! let engine = Engine::builder().model(path).build().await?;
//! let request = ChatRequest::default()
//!     .system("You are a helpful assistant.")
//!     .user("What is the capital of France?")
//!     .max_tokens(32)
//!     .temperature(0.0);
//! let answer = engine.chat(request).await?.answer().await;
//! println!("{} ({:?}, {} tokens)", answer.text(), answer.choices[0].finish, answer.usage.completion_tokens);
//! # assert!(answer.usage.completion_tokens > 0);
//! engine.shutdown().await;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! A request runs as a `futures::Stream` of [`Output`]s: each choice's tokens as they are
//! sampled (with the text they complete), then one `Finished` with the finish reason and the
//! token counts. Dropping the stream cancels the request and frees its KV cells.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use llaisys_actors::{ChatRequest, CompletionRequest, Engine, Event, Output, StreamExt};
//! # let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tiny-tied-f32");
//! # let engine = Engine::builder().model(path).build().await?;
//!
//! let mut stream = engine.chat(ChatRequest::default().user("Tell me a story.").max_tokens(16)).await?;
//! while let Some(Output { event, .. }) = stream.next().await {
//!     match event {
//!         Event::Token { text, .. } => print!("{text}"),
//!         Event::Finished { reason, text, usage, .. } => {
//!             println!("{text}\n[{} after {} tokens]", reason.as_str(), usage.completion_tokens)
//!         }
//!     }
//! }
//!
//! // Completions take text or token ids as they are; `n` choices each, seeded per choice.
//! let request = CompletionRequest::new("def fibonacci(n):").max_tokens(8).n(2).seed(7);
//! let answer = engine.complete(request).await?.answer().await;
//! assert_eq!(answer.choices.len(), 2);
//! # engine.shutdown().await;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! A request the engine cannot run is refused before it starts, with the field at fault:
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use llaisys_actors::{ChatRequest, Engine, EngineError};
//! # let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tiny-tied-f32");
//! # let engine = Engine::builder().model(path).build().await?;
//! let refused = engine.chat(ChatRequest::default().message("robot", "hi")).await;
//! let Err(EngineError::Request(e)) = refused else { panic!("accepted") };
//! assert_eq!(e.param.as_deref(), Some("messages[0].role"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! For batch jobs without a runtime, [`Llm`] takes the same requests, blocking:
//!
//! ```
//! use llaisys_actors::{ChatRequest, Engine};
//! # let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tiny-tied-f32");
//! let mut llm = Engine::builder().model(path).build_offline()?;
//! let questions = ["Hello!", "What is 2 + 2?"];
//! let requests: Vec<ChatRequest> =
//!     questions.iter().map(|q| ChatRequest::default().user(*q).max_tokens(8).temperature(0.0)).collect();
//! for answer in llm.chat(&requests)? {
//!     println!("{}", answer.text());
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Parts
//!
//! Each subsystem is a folder of the same shape: its actor (`actor.rs`), the messages it takes
//! (`messages.rs`, `ToX`), the policy it owns, and its tests.
//!
//! - `host/`: the host-app API — `Engine::builder()`, `ChatRequest` / `CompletionRequest` /
//!   `GenerateRequest`, the `Frontend` that renders, tokenizes and checks requests for the
//!   library and the server alike, and `Generation`, a running request as a stream;
//! - `engine/`: `Engine`, the cloneable handle (E9), its events, figures, configuration and
//!   errors, and `Router`, engines by model name (E10);
//! - `scheduler/`: the scheduler actor (one per replica; it supervises the worker) and its
//!   policy: continuous batching with budgets, KV admission and preemption, prefix reuse and
//!   session pins (E3–E6);
//! - `worker/`: the worker actor (forward pass on a blocking thread) and the executor it owns:
//!   one step on the model, then sampling (and verifying proposed tokens);
//! - `request/`: the request actor (one per request: text, stop strings, tool calls, events),
//!   the request state machine (E2) and stop-string matching (E7);
//! - `session/`: the session actor (one per conversation, E6);
//! - `placement/`: the placer actor and its policy — which replica (device) or node serves a
//!   request: session, cached prefix, load (D2, N2);
//! - `speculative/`: speculative decoding's proposers (prompt lookup, a draft model) and the
//!   policy that sizes each sequence's proposals;
//! - `cluster/`: several machines (N1–N5): the front's router, a node's actor, the wire
//!   protocol and the connections between them;
//! - `offline/`: `Llm`, blocking offline generation over the same scheduler and executor (E9).

pub mod cluster;
pub mod engine;
pub mod host;
pub mod offline;
pub mod placement;
pub mod request;
pub mod scheduler;
pub mod session;
pub mod speculative;
pub mod worker;

pub use engine::{
    Engine, EngineConfig, EngineError, EngineStats, Event, EventStream, ModelLoader, ReplicaSpec, ReplicaStats, Router,
    SpeculativeStats, Usage,
};
pub use futures_util::StreamExt;
pub use host::{
    Answer, BuildError, ChatRequest, Choice, CompletionRequest, EmbedRequest, Embeddings, EngineBuilder, Frontend,
    GenerateParams, GenerateRequest, Generation, Infill, ModelText, Options, Output, Prompt, RequestError,
    RequestLimits, RerankRequest, Reranker, SchedulingPolicy, Scores, Tool, ToolChoice, ValidRequest,
};
pub use llaisys_model::tokenizer::{ChatMessage, FimFile};
pub use llaisys_model::{Constraint, Device, DeviceSpec, Guidance, Pooling, WeightDtype};
pub use offline::{Completion, Llm};
pub use scheduler::enqueue_by_priority;
pub use session::SessionInfo;
