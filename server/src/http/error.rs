//! S3: errors as OpenAI error objects, `{"error": {"message", "type", "param", "code"}}`, with
//! the status that says what went wrong.

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
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), param: None, code: None, retry_after: None }
    }

    /// 400, naming the offending parameter.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self { param: Some(param.into()), ..Self::new(StatusCode::BAD_REQUEST, message) }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message).with_code("invalid_api_key")
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    pub fn model_not_found(model: &str, available: &str) -> Self {
        Self {
            param: Some("model".into()),
            ..Self::not_found(format!("The model '{model}' does not exist. Served models: {available}"))
                .with_code("model_not_found")
        }
    }

    pub fn overloaded(message: impl Into<String>) -> Self {
        Self {
            retry_after: Some(1),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, message).with_code("rate_limit_exceeded")
        }
    }

    pub fn shutting_down() -> Self {
        Self { retry_after: Some(5), ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down") }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
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

    /// The error object (also sent as an SSE event when a stream fails).
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind(), "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match &e {
            EngineError::Rejected(_) | EngineError::Admission { .. } => {
                Self::bad_request(e.to_string()).with_code("context_length_exceeded")
            }
            EngineError::Sampling(_) | EngineError::Tokenizer(_) | EngineError::InvalidSession(_) => {
                Self::bad_request(e.to_string())
            }
            EngineError::Decode(llaisys_model::DecodeError::InvalidInput(m)) => Self::bad_request(m.clone()),
            EngineError::UnknownModel { name, available } => Self::model_not_found(name, available),
            EngineError::ShuttingDown => Self::shutting_down(),
            EngineError::Overloaded(why) => Self::overloaded(why.clone()),
            EngineError::Request(r) => r.clone().into(),
            _ => Self::internal(e.to_string()),
        }
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
