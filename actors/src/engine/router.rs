//! E10: routing by model name. A `Router` holds one engine per served model; a request names
//! its model, and an unknown name is an error that lists the served ones.

use std::collections::BTreeMap;

use super::api::Engine;
use super::error::EngineError;
use super::event::EventStream;
use crate::host::GenerateRequest;

/// Engines by model name. Cloning shares the engines.
#[derive(Clone, Default)]
pub struct Router {
    engines: BTreeMap<String, Engine>,
}

impl Router {
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `engine` under `name`; a name can be served only once.
    pub fn add(&mut self, name: impl Into<String>, engine: Engine) -> Result<(), EngineError> {
        let name = name.into();
        if self.engines.contains_key(&name) {
            return Err(EngineError::DuplicateModel { name });
        }
        self.engines.insert(name, engine);
        Ok(())
    }

    /// The served model names, sorted.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.engines.keys().map(String::as_str)
    }

    /// Every engine with its model name, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Engine)> {
        self.engines.iter().map(|(name, engine)| (name.as_str(), engine))
    }

    /// The one model's name, when exactly one is served.
    pub fn only(&self) -> Option<&str> {
        match self.engines.len() {
            1 => self.models().next(),
            _ => None,
        }
    }

    /// The engine serving `model`.
    pub fn engine(&self, model: &str) -> Result<&Engine, EngineError> {
        self.engines.get(model).ok_or_else(|| EngineError::UnknownModel {
            name: model.into(),
            available: self.models().map(String::from).collect(),
        })
    }

    /// Queues a request on the engine serving `model`.
    pub async fn generate(&self, model: &str, request: GenerateRequest) -> Result<EventStream, EngineError> {
        self.engine(model)?.generate(request).await
    }

    /// Shuts every engine down, draining their requests.
    pub async fn shutdown(&self) {
        for engine in self.engines.values() {
            engine.shutdown().await;
        }
    }
}
