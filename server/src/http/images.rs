//! Images in chat messages, whichever dialect sends them: the bytes a part carries (a `data:`
//! URL, or base64 as Anthropic's and Ollama's sources give it), where in its message's text it
//! stands, then prepared for the model (decoded, resized, cut into patches: the model's own
//! processor) off the async threads, and attached to the engine's messages.

use std::sync::Arc;

use base64::Engine as _;
use llaisys_model::tokenizer::{ChatMessage, MessageImage};

use super::ModelEntry;
use super::error::ApiError;

/// Most bytes of one image as sent (decoded from base64): a larger one is refused.
const MAX_IMAGE_BYTES: usize = 32 << 20;

/// An image a message carries, not prepared yet.
#[derive(Debug)]
pub struct Pending {
    /// The message it belongs to.
    pub message: usize,
    /// The byte offset into the message's text it stands at.
    pub at: usize,
    pub bytes: Vec<u8>,
    /// The field that gave it (`messages[0].content[1].image_url`), for errors.
    pub param: String,
}

/// The bytes of an image given as a URL: a `data:` URL of base64 bytes (what OpenAI's clients
/// send for local files). A remote URL is refused by name: this server fetches nothing.
pub fn from_url(url: &str, param: &str) -> Result<Vec<u8>, ApiError> {
    let Some(rest) = url.strip_prefix("data:") else {
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        let reason = match scheme {
            "http" | "https" => {
                "remote image URLs are not fetched by this server; send the image inline as a \
                                 data: URL (data:image/png;base64,...)"
            }
            _ => "expected a data: URL (data:image/png;base64,...)",
        };
        return Err(ApiError::invalid(param, reason));
    };
    let Some((meta, data)) = rest.split_once(',') else {
        return Err(ApiError::invalid(param, "a data: URL needs a comma before its data"));
    };
    if !meta.ends_with(";base64") {
        return Err(ApiError::invalid(param, "expected a base64 data: URL (data:image/png;base64,...)"));
    }
    from_base64(data, param)
}

/// Base64 bytes (standard alphabet; padding and line breaks tolerated).
pub fn from_base64(data: &str, param: &str) -> Result<Vec<u8>, ApiError> {
    if data.len() / 4 * 3 > MAX_IMAGE_BYTES {
        return Err(ApiError::invalid(param, format!("the image is larger than {} MiB", MAX_IMAGE_BYTES >> 20)));
    }
    let cleaned: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    engine
        .decode(cleaned.as_bytes())
        .map_err(|e| ApiError::invalid(param, format!("the image's base64 is not valid: {e}")))
}

/// Prepares `pending` for `model` (its processor, on the blocking pool) and attaches each to its
/// message. A model that sees no images refuses them, naming the first.
pub async fn attach(model: &ModelEntry, messages: &mut [ChatMessage], pending: Vec<Pending>) -> Result<(), ApiError> {
    let Some(first) = pending.first() else {
        return Ok(());
    };
    let Some(vision) = model.info().vision.clone() else {
        let reason = format!("this model ({}) takes text only, not images", model.info().model_type);
        return Err(ApiError::invalid(&first.param, reason));
    };
    let prepared = tokio::task::spawn_blocking(move || {
        pending
            .into_iter()
            .map(|p| match vision.processor.prepare(&p.bytes) {
                Ok(image) => Ok((p.message, p.at, Arc::new(image))),
                Err(e) => Err(ApiError::invalid(&p.param, e.to_string())),
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| ApiError::internal(format!("preparing images: {e}")))??;
    for (message, at, image) in prepared {
        if let Some(m) = messages.get_mut(message) {
            m.images.push(MessageImage { at, image });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_urls_are_read_and_remote_urls_refused_by_name() {
        assert_eq!(from_url("data:image/png;base64,aGVsbG8=", "p").unwrap(), b"hello");
        assert_eq!(from_url("data:image/png;base64,aGVs\nbG8", "p").unwrap(), b"hello");
        let err = from_url("https://example.com/cat.png", "messages[0].content[1].image_url").unwrap_err();
        assert!(format!("{err:?}").contains("not fetched"), "{err:?}");
        assert!(from_url("data:image/png,raw", "p").is_err());
        assert!(from_url("data:image/png;base64,@@@", "p").is_err());
    }
}
