//! Throwaway credentials: a CA that signs serving certificates (the API
//! server's, each kubelet's, MinIO's) and client certificates (the API
//! server's to its kubelets), and a service-account signing key.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use std::path::Path;

use crate::{Error, Result};

/// A certificate and its private key, PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Issued {
    /// Writes the certificate and the key as `dir`/`cert` and `dir`/`key`,
    /// making `dir`.
    pub fn write_to(&self, dir: &Path, cert: &str, key: &str) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        for (name, pem) in [(cert, &self.cert_pem), (key, &self.key_pem)] {
            let path = dir.join(name);
            std::fs::write(&path, pem).map_err(|e| Error::io(&path, e))?;
        }
        Ok(())
    }
}

pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl Ca {
    pub fn generate() -> Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "oxhorn-testbed-ca");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key)?;
        Ok(Self {
            issuer: Issuer::new(params, key),
            pem: cert.pem(),
        })
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A server certificate for `names` (DNS names or IP addresses).
    pub fn serving(&self, common_name: &str, names: &[&str]) -> Result<Issued> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    /// A client certificate of user `common_name` in `group`, as Kubernetes
    /// reads them (CN and O).
    pub fn client(&self, common_name: &str, group: &str) -> Result<Issued> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, group);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    fn issue(&self, params: CertificateParams) -> Result<Issued> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// `GET path` over HTTP/1.1 and TLS to `address`, trusting only the CA
/// `ca_pem` and checking the certificate names `host`: the whole answer
/// (status line, headers and body), or why there is none within 10 s.
pub async fn https_get(
    address: std::net::SocketAddr,
    ca_pem: &str,
    host: &str,
    path: &str,
) -> std::result::Result<String, String> {
    let asked = https_get_unbounded(address, ca_pem, host, path);
    match tokio::time::timeout(std::time::Duration::from_secs(10), asked).await {
        Ok(answer) => answer,
        Err(_) => Err(format!("no answer from {address} within 10 s")),
    }
}

async fn https_get_unbounded(
    address: std::net::SocketAddr,
    ca_pem: &str,
    host: &str,
    path: &str,
) -> std::result::Result<String, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let failed = |e: &dyn std::fmt::Display| e.to_string();
    let mut roots = rustls::RootCertStore::empty();
    let ca = CertificateDer::from_pem_slice(ca_pem.as_bytes()).map_err(|e| failed(&e))?;
    roots.add(ca).map_err(|e| failed(&e))?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| failed(&e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from(host.to_owned()).map_err(|e| failed(&e))?;
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| failed(&e))?;
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| failed(&e))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| failed(&e))?;
    let mut answer = String::new();
    tls.read_to_string(&mut answer)
        .await
        .map_err(|e| failed(&e))?;
    Ok(answer)
}

/// A service-account signing key: (private, public), PEM.
pub fn service_account_key() -> Result<(String, String)> {
    let key = KeyPair::generate()?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}
