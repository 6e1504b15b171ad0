//! The Web UI's files (W1–W6), built into the binary from `webui/`: the page at `/`, its
//! scripts and styles under `/ui/`. They are open (no API key), like /health; the page asks
//! for a key when the API wants one.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::sync::Arc;

use super::AppState;
use super::error::ApiError;

/// (name under /ui/, content type, bytes).
const FILES: &[(&str, &str, &[u8])] = &[
    ("app.js", "text/javascript; charset=utf-8", include_bytes!("../../../webui/app.js")),
    ("api.js", "text/javascript; charset=utf-8", include_bytes!("../../../webui/api.js")),
    ("store.js", "text/javascript; charset=utf-8", include_bytes!("../../../webui/store.js")),
    ("markdown.js", "text/javascript; charset=utf-8", include_bytes!("../../../webui/markdown.js")),
    ("style.css", "text/css; charset=utf-8", include_bytes!("../../../webui/style.css")),
    ("icon.svg", "image/svg+xml", include_bytes!("../../../webui/icon.svg")),
];

const INDEX: &[u8] = include_bytes!("../../../webui/index.html");

/// Everything comes from this origin; nothing from the internet, no inline script.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/", get(index)).route("/ui/{file}", get(file))
}

async fn index() -> Response {
    serve("text/html; charset=utf-8", INDEX)
}

async fn file(Path(name): Path<String>) -> Response {
    match FILES.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, bytes)) => serve(content_type, bytes),
        None => ApiError::not_found(format!("the Web UI has no file '{name}'")).into_response(),
    }
}

fn serve(content_type: &'static str, bytes: &'static [u8]) -> Response {
    let mut response = bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Revalidate every load: a new binary must never run with an old script.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}
