//! Throwaway credentials for the test API server: a CA, a serving certificate
//! for 127.0.0.1, and a service-account signing key.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::Result;

pub struct Pki {
    pub ca_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    pub service_account_key_pem: String,
    pub service_account_pub_pem: String,
}

pub fn generate() -> Result<Pki> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "oxhorn-testbed-ca");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let serving_key = KeyPair::generate()?;
    let mut serving =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving.signed_by(&serving_key, &issuer)?;

    let service_account_key = KeyPair::generate()?;
    Ok(Pki {
        ca_pem: ca_cert.pem(),
        serving_cert_pem: serving_cert.pem(),
        serving_key_pem: serving_key.serialize_pem(),
        service_account_key_pem: service_account_key.serialize_pem(),
        service_account_pub_pem: service_account_key.public_key_pem(),
    })
}
