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

/// A service-account signing key: (private, public), PEM.
pub fn service_account_key() -> Result<(String, String)> {
    let key = KeyPair::generate()?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}
