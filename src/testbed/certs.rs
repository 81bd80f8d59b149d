//! Throwaway credentials for the test API server: a CA, a serving certificate
//! for 127.0.0.1, and a service-account signing key.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::{Error, Result};

pub struct Pki {
    pub ca_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    pub service_account_key_pem: String,
    pub service_account_pub_pem: String,
}

fn rcgen_error(e: rcgen::Error) -> Error {
    Error::Testbed(format!("generating test certificates: {e}"))
}

pub fn generate() -> Result<Pki> {
    let ca_key = KeyPair::generate().map_err(rcgen_error)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(rcgen_error)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "oxhorn-testbed-ca");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).map_err(rcgen_error)?;
    let issuer = Issuer::new(ca, ca_key);

    let serving_key = KeyPair::generate().map_err(rcgen_error)?;
    let mut serving =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .map_err(rcgen_error)?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_cert = serving
        .signed_by(&serving_key, &issuer)
        .map_err(rcgen_error)?;

    let service_account_key = KeyPair::generate().map_err(rcgen_error)?;
    Ok(Pki {
        ca_pem: ca_cert.pem(),
        serving_cert_pem: serving_cert.pem(),
        serving_key_pem: serving_key.serialize_pem(),
        service_account_key_pem: service_account_key.serialize_pem(),
        service_account_pub_pem: service_account_key.public_key_pem(),
    })
}
