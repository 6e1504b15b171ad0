//! Images in chat messages, whichever dialect sends them: the bytes a part carries (a `data:`
//! URL, or base64 as Anthropic's and Ollama's sources give it) or the remote URL it names
//! (fetched: `fetch`), where in its message's text it stands, then prepared for the model
//! (decoded, resized, cut into patches: the model's own processor) off the async threads, and
//! attached to the engine's messages.

use std::sync::Arc;

use base64::Engine as _;
use llaisys_model::tokenizer::{ChatMessage, MessageImage};

use super::ModelEntry;
use super::error::ApiError;
use super::fetch::Fetcher;

/// Most bytes of one image as sent (decoded from base64, or fetched): a larger one is refused.
pub const MAX_IMAGE_BYTES: usize = 32 << 20;

/// An image as a request gives it.
#[derive(Debug)]
pub enum ImageData {
    Bytes(Vec<u8>),
    /// An http or https URL, fetched before the image is prepared.
    Url(String),
}

/// An image a message carries, not prepared yet.
#[derive(Debug)]
pub struct Pending {
    /// The message it belongs to.
    pub message: usize,
    /// The byte offset into the message's text it stands at.
    pub at: usize,
    pub data: ImageData,
    /// The field that gave it (`messages[0].content[1].image_url`), for errors.
    pub param: String,
}

/// An image given as a URL: a `data:` URL of base64 bytes (what OpenAI's clients send for local
/// files), or an http or https URL to fetch.
pub fn from_url(url: &str, param: &str) -> Result<ImageData, ApiError> {
    let Some(rest) = url.strip_prefix("data:") else {
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        return match scheme.to_ascii_lowercase().as_str() {
            "http" | "https" => Ok(ImageData::Url(url.to_string())),
            _ => Err(ApiError::invalid(param, "expected a data: URL (data:image/png;base64,...) or an http(s) URL")),
        };
    };
    let Some((meta, data)) = rest.split_once(',') else {
        return Err(ApiError::invalid(param, "a data: URL needs a comma before its data"));
    };
    if !meta.ends_with(";base64") {
        return Err(ApiError::invalid(param, "expected a base64 data: URL (data:image/png;base64,...)"));
    }
    from_base64(data, param).map(ImageData::Bytes)
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

/// Fetches `pending`'s remote images (through `fetcher`, together), prepares them all for
/// `model` (its processor, on the blocking pool) and attaches each to its message. A model that
/// sees no images refuses them, naming the first, before anything is fetched.
pub async fn attach(
    fetcher: &Fetcher,
    model: &ModelEntry,
    messages: &mut [ChatMessage],
    pending: Vec<Pending>,
) -> Result<(), ApiError> {
    let Some(first) = pending.first() else {
        return Ok(());
    };
    let Some(vision) = model.info().vision.clone() else {
        let reason = format!("this model ({}) takes text only, not images", model.info().model_type);
        return Err(ApiError::invalid(&first.param, reason));
    };
    let fetched = futures_util::future::try_join_all(pending.into_iter().map(|p| async move {
        let bytes = match p.data {
            ImageData::Bytes(bytes) => bytes,
            ImageData::Url(ref url) => fetcher.get(url, &p.param, MAX_IMAGE_BYTES).await?,
        };
        Ok::<_, ApiError>((p.message, p.at, bytes, p.param))
    }))
    .await?;
    let prepared = tokio::task::spawn_blocking(move || {
        fetched
            .into_iter()
            .map(|(message, at, bytes, param)| match vision.processor.prepare(&bytes) {
                Ok(image) => Ok((message, at, Arc::new(image))),
                Err(e) => Err(ApiError::invalid(&param, e.to_string())),
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
    fn data_urls_are_read_and_remote_urls_kept_to_fetch() {
        let bytes = |url: &str| match from_url(url, "p").unwrap() {
            ImageData::Bytes(b) => b,
            ImageData::Url(u) => panic!("{u} is not inline"),
        };
        assert_eq!(bytes("data:image/png;base64,aGVsbG8="), b"hello");
        assert_eq!(bytes("data:image/png;base64,aGVs\nbG8"), b"hello");
        let url = "https://example.com/cat.png";
        assert!(matches!(from_url(url, "p").unwrap(), ImageData::Url(u) if u == url));
        let err = from_url("file:///etc/passwd", "messages[0].content[1].image_url").unwrap_err();
        assert!(format!("{err:?}").contains("http(s) URL"), "{err:?}");
        assert!(from_url("data:image/png,raw", "p").is_err());
        assert!(from_url("data:image/png;base64,@@@", "p").is_err());
    }
}
