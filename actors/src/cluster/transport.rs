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

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("the cluster cookie: {0}")]
    Cookie(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("the cluster listener on {addr}: {reason}")]
    Listen { addr: SocketAddr, reason: String },
    #[error("cluster actor: {0}")]
    Actor(String),
}

/// The shared secret nodes authenticate with: the first line of `file`, else
/// `LLAISYS_CLUSTER_COOKIE`. Never taken from the command line (other users see argv).
pub fn read_cookie(file: Option<&Path>) -> Result<String, ClusterError> {
    let (cookie, origin) = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ClusterError::Cookie(format!("reading {}: {e}", path.display())))?;
            (text.lines().next().unwrap_or("").trim().to_string(), path.display().to_string())
        }
        None => match std::env::var(COOKIE_VAR) {
            Ok(value) => (value.trim().to_string(), COOKIE_VAR.to_string()),
            Err(_) => {
                return Err(ClusterError::Cookie(format!("none given: set {COOKIE_VAR} or pass --cookie-file FILE")));
            }
        },
    };
    if cookie.is_empty() {
        return Err(ClusterError::Cookie(format!("{origin} is empty")));
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
            .map_err(|e| ClusterError::Tls(format!("the key {}: {e}", key.display())))?;
        let config = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| ClusterError::Tls(e.to_string()))?;
        Ok(Tls::Server(TlsAcceptor::from(Arc::new(config))))
    }

    /// A worker's side: the certificate authority (PEM) that signed the front's certificate,
    /// and the name the front's certificate is for (`localhost`, a DNS name or an IP).
    pub fn client(ca: &Path, server_name: &str) -> Result<Self, ClusterError> {
        let mut roots = RootCertStore::empty();
        for cert in read_certs(ca)? {
            roots.add(cert).map_err(|e| ClusterError::Tls(format!("{}: {e}", ca.display())))?;
        }
        let config = ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
        let server_name = ServerName::try_from(server_name.to_string())
            .map_err(|e| ClusterError::Tls(format!("the front's name '{server_name}': {e}")))?;
        Ok(Tls::Client { connector: TlsConnector::from(Arc::new(config)), server_name })
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ClusterError> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| ClusterError::Tls(format!("{}: {e}", path.display())))?
        .collect();
    let certs = certs.map_err(|e| ClusterError::Tls(format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(ClusterError::Tls(format!("{} holds no certificate", PathBuf::from(path).display())));
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
        Some(Tls::Client { .. }) => return Err(ClusterError::Tls("a listener needs a certificate and key".into())),
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
    drop(std::net::TcpListener::bind(addr).map_err(|e| ClusterError::Listen { addr, reason: e.to_string() })?);
    let server = NodeServer::new(
        addr.port(),
        cookie,
        name.to_string(),
        addr.ip().to_string(),
        Some(encryption),
        Some(NodeConnectionMode::Isolated),
    )
    .with_listen_addr(addr.ip());
    let (server, _) =
        Actor::spawn(None, server, ()).await.map_err(|e| ClusterError::Listen { addr, reason: e.to_string() })?;
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
