//! CORS (`server.cors_origins`): web pages on the listed origins may call the API from a
//! browser. A preflight (`OPTIONS` with `Access-Control-Request-Method`) from an allowed origin
//! is answered here, before authentication (browsers send no credentials with it); other
//! requests from an allowed origin get `Access-Control-Allow-Origin` on their response. Origins
//! not listed get no CORS headers, so the browser keeps the response from the page.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The allowed origins (`*`: any).
#[derive(Debug, Clone)]
pub struct Cors {
    origins: Vec<String>,
}

impl Cors {
    pub fn new(origins: Vec<String>) -> Arc<Self> {
        Arc::new(Self { origins })
    }

    fn allows(&self, origin: &str) -> bool {
        self.origins.iter().any(|o| o == "*" || o == origin)
    }
}

/// Headers a page may read from a response.
const EXPOSED: &str = "x-request-id, retry-after";
/// Methods the API has.
const METHODS: &str = "GET, POST, DELETE, OPTIONS";
/// Headers allowed when a preflight names none.
const HEADERS: &str = "authorization, content-type, x-api-key, x-request-id, anthropic-version";

pub async fn cors(State(cors): State<Arc<Cors>>, req: Request, next: Next) -> Response {
    let origin = req.headers().get(header::ORIGIN).and_then(|v| v.to_str().ok()).map(str::to_string);
    let Some(origin) = origin.filter(|o| cors.allows(o)) else { return next.run(req).await };
    let Ok(allowed) = HeaderValue::from_str(&origin) else { return next.run(req).await };
    let preflight =
        req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = if preflight {
        let asked = req.headers().get(header::ACCESS_CONTROL_REQUEST_HEADERS).cloned();
        let mut response = StatusCode::NO_CONTENT.into_response();
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static(METHODS));
        headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.unwrap_or(HeaderValue::from_static(HEADERS)));
        headers.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        response
    } else {
        next.run(req).await
    };
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
    headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static(EXPOSED));
    headers.append(header::VARY, HeaderValue::from_static("origin"));
    response
}
