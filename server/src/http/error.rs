//! S3: errors as OpenAI error objects, `{"error": {"message", "type", "param", "code"}}`, with
//! the status that says what went wrong; the other dialects' routes answer the same error in
//! their own shape (`ErrorShape`). Every error also carries a stable label, `error_type` (the
//! engine's own for engine errors), which the access log prints and
//! `llaisys_request_errors_total` counts.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use llaisys_actors::{EngineError, RequestError};
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds a client should wait before retrying (429, 503).
    pub retry_after: Option<u64>,
    /// What went wrong, as a label for logs and metrics (`invalid_request`, `overloaded`, ...).
    pub error_type: &'static str,
}

/// How a dialect writes an error object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorShape {
    /// `{"error": {"message", "type", "param", "code"}}` (chat, completions, responses).
    #[default]
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}` (Anthropic's Messages API).
    Anthropic,
    /// `{"error": "message"}` (Ollama's API).
    Ollama,
}

impl ErrorShape {
    /// The shape of the errors of a route.
    pub fn of_path(path: &str) -> Self {
        if path.starts_with("/v1/messages") {
            Self::Anthropic
        } else if path.starts_with("/api/") {
            Self::Ollama
        } else {
            Self::OpenAi
        }
    }
}

/// The label of an error response, for the access log and the error counter.
#[derive(Debug, Clone, Copy)]
pub struct ErrorType(pub &'static str);

impl ApiError {
    fn new(status: StatusCode, error_type: &'static str, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), param: None, code: None, retry_after: None, error_type }
    }

    /// 400, naming the offending parameter.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self { param: Some(param.into()), ..Self::bad_request(message) }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// 413: the body is larger than `server.max_body_bytes`.
    pub fn too_large() -> Self {
        let message = "the request body is larger than the server's limit (server.max_body_bytes)";
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", message)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this route")
    }

    /// 413: the stored files would pass `server.stored_files_bytes`.
    pub fn files_full(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "files_full", message)
    }

    /// The request field at fault.
    pub fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message).with_code("invalid_api_key")
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn model_not_found(model: &str, available: &str) -> Self {
        Self {
            param: Some("model".into()),
            error_type: "unknown_model",
            ..Self::not_found(format!("The model '{model}' does not exist. Served models: {available}"))
                .with_code("model_not_found")
        }
    }

    pub fn overloaded(message: impl Into<String>) -> Self {
        Self {
            retry_after: Some(1),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "overloaded", message).with_code("rate_limit_exceeded")
        }
    }

    pub fn shutting_down() -> Self {
        Self {
            retry_after: Some(5),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", "the server is shutting down")
        }
    }

    /// 503: nothing can serve the request now (a cluster without nodes, a stopped engine).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self { retry_after: Some(5), ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message) }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// OpenAI's error `type` for the status.
    pub fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE | StatusCode::METHOD_NOT_ALLOWED => {
                "invalid_request_error"
            }
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
            _ => "server_error",
        }
    }

    /// Anthropic's error `type` for the status.
    fn anthropic_kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST | StatusCode::METHOD_NOT_ALLOWED => "invalid_request_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            _ => "api_error",
        }
    }

    /// The OpenAI error object (also sent as an SSE event when a stream fails).
    pub fn body(&self) -> serde_json::Value {
        self.body_in(ErrorShape::OpenAi)
    }

    /// The error object in a dialect's shape.
    pub fn body_in(&self, shape: ErrorShape) -> serde_json::Value {
        match shape {
            ErrorShape::OpenAi => {
                json!({"error": {"message": self.message, "type": self.kind(), "param": self.param, "code": self.code}})
            }
            ErrorShape::Anthropic => {
                json!({"type": "error", "error": {"type": self.anthropic_kind(), "message": self.message}})
            }
            ErrorShape::Ollama => json!({"error": self.message}),
        }
    }

    /// The error response in a dialect's shape.
    pub fn response_in(self, shape: ErrorShape) -> Response {
        let mut response = (self.status, Json(self.body_in(shape))).into_response();
        if let Some(secs) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response.extensions_mut().insert(ErrorType(self.error_type));
        response
    }
}

/// An error answered in Anthropic's shape, for handlers of its routes that return `Result`
/// (`?` turns an `ApiError` into it).
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        self.0.response_in(ErrorShape::Anthropic)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.response_in(ErrorShape::OpenAi)
    }
}

impl From<EngineError> for ApiError {
    /// Every engine error's status, by what went wrong: the request (400, 404), the server's
    /// load or state (429, 503), or the engine itself (500).
    fn from(e: EngineError) -> Self {
        let (message, error_type) = (e.to_string(), e.error_type());
        let error = match e {
            EngineError::Request(r) => r.into(),
            EngineError::NoTokenizer => Self::bad_request(message),
            EngineError::UnknownModel { name, available } => Self::model_not_found(&name, &available.join(", ")),
            EngineError::ShuttingDown => Self::shutting_down(),
            EngineError::Overloaded { .. } => Self::overloaded(message),
            EngineError::NoReplica | EngineError::Stopped { .. } => Self::unavailable(message),
            EngineError::DuplicateModel { .. }
            | EngineError::WorkerLost { .. }
            | EngineError::Node { .. }
            | EngineError::Spawn { .. }
            | EngineError::Grammar(_)
            | EngineError::Step(_)
            | EngineError::Detokenize(_) => Self::internal(message),
        };
        Self { error_type, ..error }
    }
}

impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> Self {
        let error = match &e.param {
            Some(param) => ApiError::invalid(param, e.message),
            None => ApiError::bad_request(e.message),
        };
        match e.code {
            Some(code) => error.with_code(code),
            None => error,
        }
    }
}
