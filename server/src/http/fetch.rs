//! Images by remote URL (`https://…` in OpenAI's `image_url`, the Responses API's `image_url`,
//! Anthropic's `url` source), fetched as vLLM fetches them, with what a server on a network needs
//! around it (`server.image_urls`, `server.image_url_hosts`):
//! - **Where.** By default only hosts whose every address is public: a request cannot make the
//!   server reach its own network (loopback, private, link-local, shared and unique-local ranges,
//!   and IPv4 in IPv6). The address checked is the one connected to (no second lookup between the
//!   check and the connection), and each redirect (at most [`MAX_REDIRECTS`]) is checked again.
//!   `image_url_hosts` lists the only hosts fetched from (then private ones too); `image_urls =
//!   "any"` fetches from anywhere, `"off"` from nowhere.
//! - **How much.** At most [`crate::http::images::MAX_IMAGE_BYTES`] an image, read as it arrives;
//!   [`TIMEOUT`] for a whole fetch; the images of one request fetched together.
//!
//! A URL that cannot be fetched is the request's error (400), naming the field and why.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde::Deserialize;

use super::error::ApiError;

/// Redirects followed for one image.
pub const MAX_REDIRECTS: usize = 3;
/// Longest a fetch of one image may take, redirects included.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Which remote image URLs are fetched (`server.image_urls`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageUrls {
    /// None: images come inline.
    Off,
    /// Hosts whose every address is public (or listed in `image_url_hosts`).
    #[default]
    Public,
    /// Any host.
    Any,
}

/// The server's rule for remote image URLs.
#[derive(Debug, Clone, Default)]
pub struct Fetcher {
    pub urls: ImageUrls,
    /// The only hosts fetched from, where not empty (any of their addresses).
    pub hosts: Vec<String>,
}

impl Fetcher {
    /// The bytes at `url` (http or https), where this server may fetch it; `param` names the
    /// request's field in errors.
    pub async fn get(&self, url: &str, param: &str, limit: usize) -> Result<Vec<u8>, ApiError> {
        let refuse = |reason: String| ApiError::invalid(param, reason);
        if self.urls == ImageUrls::Off {
            return Err(refuse(
                "remote image URLs are not fetched by this server (server.image_urls = \"off\"); send the \
                 image inline as a data: URL (data:image/png;base64,...)"
                    .into(),
            ));
        }
        let fetch = async {
            let mut at = reqwest::Url::parse(url).map_err(|e| refuse(format!("not a URL: {e}")))?;
            for _ in 0..=MAX_REDIRECTS {
                let (client, shown) = self.client_for(&at).await.map_err(refuse)?;
                let response = client
                    .get(at.clone())
                    .send()
                    .await
                    .map_err(|e| refuse(format!("fetching the image from {shown} failed: {}", without_url(&e))))?;
                let status = response.status();
                if status.is_redirection() {
                    let location = response.headers().get(reqwest::header::LOCATION).and_then(|l| l.to_str().ok());
                    let next = location.and_then(|l| at.join(l).ok());
                    at = next.ok_or_else(|| refuse(format!("{shown} redirected ({status}) to no usable location")))?;
                    continue;
                }
                if !status.is_success() {
                    return Err(refuse(format!("fetching the image from {shown} gave HTTP {status}")));
                }
                return read(response, limit).await.map_err(|reason| refuse(format!("{shown}: {reason}")));
            }
            Err(refuse(format!("more than {MAX_REDIRECTS} redirects")))
        };
        match tokio::time::timeout(TIMEOUT, fetch).await {
            Ok(result) => result,
            Err(_) => Err(refuse(format!("fetching the image took longer than {} s", TIMEOUT.as_secs()))),
        }
    }

    /// A client that connects to `url`'s host only at the addresses checked here, and the
    /// host as errors show it.
    async fn client_for(&self, url: &reqwest::Url) -> Result<(reqwest::Client, String), String> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("expected an http or https URL, or a data: URL; not {}:", url.scheme()));
        }
        let host = url.host_str().filter(|h| !h.is_empty()).ok_or("the URL has no host")?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let listed = self.hosts.iter().any(|h| h.eq_ignore_ascii_case(bare));
        if !self.hosts.is_empty() && !listed {
            return Err(format!("images are fetched only from server.image_url_hosts, which has no {bare}"));
        }
        let port = url.port_or_known_default().ok_or("the URL has no port")?;
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| format!("{bare} could not be resolved: {e}"))?
            .collect();
        if addrs.is_empty() {
            return Err(format!("{bare} has no address"));
        }
        if self.urls == ImageUrls::Public
            && !listed
            && let Some(inner) = addrs.iter().find(|a| !is_public(a.ip()))
        {
            return Err(format!(
                "{bare} is at {}, not a public address: this server fetches images from the public internet only \
                 (server.image_url_hosts lists hosts it may reach otherwise)",
                inner.ip()
            ));
        }
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .resolve_to_addrs(bare, &addrs)
            .user_agent(concat!("llaisys/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("no HTTP client: {e}"))?;
        Ok((client, bare.to_string()))
    }
}

/// The body, refused once past `limit` bytes.
async fn read(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, String> {
    let too_large = || format!("the image is larger than {} MiB", limit >> 20);
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    while let Some(chunk) =
        response.chunk().await.map_err(|e| format!("reading the image failed: {}", without_url(&e)))?
    {
        if bytes.len() + chunk.len() > limit {
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// reqwest's error without the URL it carries (the request's own field already names it).
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(&format!(" ({url})"), "").replace(url.as_str(), "the URL");
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}

/// Whether `ip` is on the public internet: not this machine, its network, or a range kept for
/// other uses.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_documentation()
                || v4.is_multicast()
                || a == 0
                || (a == 100 && (64..128).contains(&b)) // shared (carrier-grade NAT)
                || (a == 198 && (18..20).contains(&b)) // benchmarking
                || a >= 240)
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public(IpAddr::V4(v4)),
            None => {
                !(v6.is_loopback()
                    || v6.is_unspecified()
                    || v6.is_multicast()
                    || v6.is_unique_local()
                    || v6.is_unicast_link_local()
                    || (v6.segments()[0] == 0x64 && v6.segments()[1] == 0xff9b)) // NAT64
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_public() {
        for private in
            ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0"]
        {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for private in ["::1", "::", "fd00::1", "fe80::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "64:ff9b::a00:1"] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }
}
