//! TLS from the dispatcher to a VIP's backends, as the WebSphere plug-in speaks HTTPS to
//! application servers: the backend's certificate is verified against a CA file (or the
//! system's roots) for a configured name (or the backend's address), with a client
//! certificate when configured. Sessions are resumed when the backend allows it, and the
//! connections are pooled like plain ones.

use std::{net::IpAddr, sync::Arc};

use anyhow::{anyhow, Context};
use rustls::{pki_types::ServerName, ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::{config::BackendTlsFiles, http1::io::TlsConn};

/// The client configuration a VIP's backends share.
pub fn client_config(f: &BackendTlsFiles) -> anyhow::Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    match &f.ca_file {
        Some(path) => {
            for cert in super::certs::read_chain(path)? {
                roots.add(cert).map_err(|e| anyhow!("{}: a CA certificate is not usable: {e}", path.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A system root rustls cannot use is skipped, as every TLS client does.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(anyhow!("no system root certificates found (set backend_tls.ca_file)"));
            }
        }
    }
    let builder = ClientConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match &f.client_cert {
        Some((cert, key)) => builder
            .with_client_auth_cert(super::certs::read_chain(cert)?, super::certs::read_key(key)?)
            .with_context(|| format!("client certificate {}", cert.display()))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// TLS to one backend.
pub struct BackendTls {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl BackendTls {
    /// `address`: the backend's, the name verified when none is configured.
    pub fn new(config: Arc<ClientConfig>, f: &BackendTlsFiles, address: IpAddr) -> BackendTls {
        let name = f
            .server_name
            .as_deref()
            .and_then(|n| ServerName::try_from(n.to_string()).ok())
            .unwrap_or(ServerName::IpAddress(address.into()));
        BackendTls { connector: TlsConnector::from(config), name }
    }

    pub async fn connect(&self, stream: TcpStream) -> std::io::Result<TlsConn> {
        Ok(tokio_rustls::TlsStream::Client(self.connector.connect(self.name.clone(), stream).await?))
    }
}
