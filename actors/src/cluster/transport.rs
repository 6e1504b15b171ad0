//! N1: the node servers and the connection between a worker and its front. ractor_cluster
//! authenticates both ends with the shared cookie (a challenge over its hash, never the cookie
//! itself) and optionally wraps the stream in TLS; it neither times out nor reconnects, so a
//! worker watches its session and dials again with backoff.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef};
use ractor_cluster::node::NodeConnectionMode;
use ractor_cluster::{IncomingEncryptionMode, NodeServer, NodeServerMessage, NodeSessionMessage};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The environment variable holding the cluster's cookie (when no file is given).
pub const COOKIE_VAR: &str = "LLAISYS_CLUSTER_COOKIE";

/// Why a front or a worker could not join the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("the cluster cookie: none given: set {COOKIE_VAR} or pass --cookie-file FILE")]
    NoCookie,
    #[error("the cluster cookie: reading {path}: {source}")]
    CookieFile { path: PathBuf, source: std::io::Error },
    #[error("the cluster cookie: {origin} is empty")]
    EmptyCookie { origin: String },
    /// A certificate or key file that does not read as PEM.
    #[error("TLS: {path}: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("TLS: {path} holds no certificate")]
    NoCertificate { path: PathBuf },
    #[error("TLS: the front's name '{name}': {reason}")]
    ServerName { name: String, reason: String },
    #[error("TLS: {0}")]
    Rustls(#[from] tokio_rustls::rustls::Error),
    #[error("TLS: a listener needs a certificate and key, not a certificate authority")]
    ClientTlsOnListener,
    #[error("the cluster listener on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("starting the cluster's {actor}: {reason}")]
    Spawn { actor: &'static str, reason: String },
}

impl ClusterError {
    /// A stable label for logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::NoCookie | Self::CookieFile { .. } | Self::EmptyCookie { .. } => "cookie",
            Self::Pem { .. }
            | Self::NoCertificate { .. }
            | Self::ServerName { .. }
            | Self::Rustls(_)
            | Self::ClientTlsOnListener => "tls",
            Self::Listen { .. } => "listen",
            Self::Spawn { .. } => "spawn_failed",
        }
    }
}

/// The shared secret nodes authenticate with: the first line of `file`, else
/// `LLAISYS_CLUSTER_COOKIE`. Never taken from the command line (other users see argv).
pub fn read_cookie(file: Option<&Path>) -> Result<String, ClusterError> {
    let (cookie, origin) = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|source| ClusterError::CookieFile { path: path.into(), source })?;
            (text.lines().next().unwrap_or("").trim().to_string(), path.display().to_string())
        }
        None => match std::env::var(COOKIE_VAR) {
            Ok(value) => (value.trim().to_string(), COOKIE_VAR.to_string()),
            Err(_) => return Err(ClusterError::NoCookie),
        },
    };
    if cookie.is_empty() {
        return Err(ClusterError::EmptyCookie { origin });
    }
    Ok(cookie)
}

/// TLS for the cluster's connections: the front's certificate and key, or the authority a
/// worker trusts for its front (with the name the front's certificate carries).
#[derive(Clone)]
pub enum Tls {
    Server(TlsAcceptor),
    Client { connector: TlsConnector, server_name: ServerName<'static> },
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Tls::Server(_) => "Tls::Server",
            Tls::Client { .. } => "Tls::Client",
        })
    }
}

impl Tls {
    /// The front's side: its certificate chain and private key (PEM files).
    pub fn server(cert: &Path, key: &Path) -> Result<Self, ClusterError> {
        let certs = read_certs(cert)?;
        let key = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| ClusterError::Pem { path: key.into(), reason: e.to_string() })?;
        let config = ServerConfig::builder().with_no_client_auth().with_single_cert(certs, key)?;
        Ok(Tls::Server(TlsAcceptor::from(Arc::new(config))))
    }

    /// A worker's side: the certificate authority (PEM) that signed the front's certificate,
    /// and the name the front's certificate is for (`localhost`, a DNS name or an IP).
    pub fn client(ca: &Path, server_name: &str) -> Result<Self, ClusterError> {
        let mut roots = RootCertStore::empty();
        for cert in read_certs(ca)? {
            roots.add(cert)?;
        }
        let config = ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
        let server_name = ServerName::try_from(server_name.to_string())
            .map_err(|e| ClusterError::ServerName { name: server_name.into(), reason: e.to_string() })?;
        Ok(Tls::Client { connector: TlsConnector::from(Arc::new(config)), server_name })
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ClusterError> {
    let pem = |e: rustls_pki_types::pem::Error| ClusterError::Pem { path: path.into(), reason: e.to_string() };
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path).map_err(pem)?.collect();
    let certs = certs.map_err(pem)?;
    if certs.is_empty() {
        return Err(ClusterError::NoCertificate { path: path.into() });
    }
    Ok(certs)
}

/// Starts this process's node server on `addr` (port 0: any free port). Without TLS, a
/// listener beyond loopback is warned about: the cookie authenticates, but nothing is encrypted.
pub async fn listen(
    name: &str,
    cookie: String,
    addr: SocketAddr,
    tls: Option<Tls>,
) -> Result<ActorRef<NodeServerMessage>, ClusterError> {
    let encryption = match tls {
        Some(Tls::Server(acceptor)) => IncomingEncryptionMode::Tls(acceptor),
        Some(Tls::Client { .. }) => return Err(ClusterError::ClientTlsOnListener),
        None => {
            if !addr.ip().is_loopback() {
                tracing::warn!(
                    %addr,
                    "the cluster listener is unencrypted beyond loopback: anyone on the network can read the \
                     traffic (give a TLS certificate and key)"
                );
            }
            IncomingEncryptionMode::Raw
        }
    };
    // Check the address first: ractor_cluster's listener reports a failed bind only in its log.
    drop(std::net::TcpListener::bind(addr).map_err(|source| ClusterError::Listen { addr, source })?);
    let server = NodeServer::new(
        addr.port(),
        cookie,
        name.to_string(),
        addr.ip().to_string(),
        Some(encryption),
        Some(NodeConnectionMode::Isolated),
    )
    .with_listen_addr(addr.ip());
    let (server, _) = Actor::spawn(None, server, ())
        .await
        .map_err(|e| ClusterError::Spawn { actor: "node server", reason: e.to_string() })?;
    Ok(server)
}

/// Whether `server` has a session that finished authentication and its initial sync.
async fn connected(server: &ActorRef<NodeServerMessage>) -> bool {
    let Ok(sessions) = ractor::call_t!(server, NodeServerMessage::GetSessions, 1000) else { return false };
    for session in sessions.into_values() {
        if let Ok(true) = ractor::call_t!(session.actor, NodeSessionMessage::GetReadyState, 1000) {
            return true;
        }
    }
    false
}

/// A worker's side: keeps a session with the front at `front`, dialling again with exponential
/// backoff (250 ms to 10 s) whenever there is none. Runs until the task is dropped.
pub async fn stay_joined(server: ActorRef<NodeServerMessage>, front: String, tls: Option<Tls>) {
    let mut backoff = Duration::from_millis(250);
    let mut was_connected = false;
    loop {
        if connected(&server).await {
            if !was_connected {
                tracing::info!(front, "connected to the front");
            }
            was_connected = true;
            backoff = Duration::from_millis(250);
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        if was_connected {
            tracing::warn!(front, "lost the front; reconnecting");
            was_connected = false;
        }
        let dialled = match &tls {
            Some(Tls::Client { connector, server_name }) => {
                ractor_cluster::client_connect_enc(&server, front.as_str(), connector.clone(), server_name.clone())
                    .await
            }
            _ => ractor_cluster::client_connect(&server, front.as_str()).await,
        };
        match dialled {
            Err(e) => tracing::warn!(front, "cannot reach the front: {e}; retrying in {} ms", backoff.as_millis()),
            Ok(()) => {
                // Authentication and the initial sync take a few round trips.
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                while tokio::time::Instant::now() < deadline && !connected(&server).await {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if connected(&server).await {
                    continue;
                }
                tracing::error!(
                    front,
                    "the front did not admit this node (a wrong cookie, or TLS on one side only); retrying in {} ms",
                    backoff.as_millis()
                );
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}
