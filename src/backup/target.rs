//! A backup target's URL and credentials, turned into the object store they
//! name. Credentials come from a Secret's data and go only into the store's
//! client: no error or log line built here holds one.

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;

use super::Backupstore;
use super::nfs::{NfsStore, Server};

/// S3: the access key pair, an endpoint for a store other than AWS (MinIO,
/// Ceph RGW) and a CA bundle (PEM) for its certificate. Longhorn's keys.
pub const AWS_ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
pub const AWS_SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";
pub const AWS_ENDPOINTS: &str = "AWS_ENDPOINTS";
pub const AWS_CERT: &str = "AWS_CERT";
/// Azure Blob: the account key or a SAS token, and the account's blob
/// endpoint when it is not `https://<account>.blob.core.windows.net`
/// (Azurite: `http://127.0.0.1:10000/devstoreaccount1`).
pub const AZBLOB_ACCOUNT_KEY: &str = "AZBLOB_ACCOUNT_KEY";
pub const AZBLOB_SAS: &str = "AZBLOB_SAS";
pub const AZBLOB_ENDPOINT: &str = "AZBLOB_ENDPOINT";

/// What a backup target's URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetUrl {
    S3 {
        bucket: String,
        region: String,
        path: String,
    },
    Azure {
        container: String,
        account: String,
        path: String,
    },
    File {
        dir: std::path::PathBuf,
    },
    /// `nfs://server:/export[/dir...][?nfsport=N&mountport=M]`: the
    /// directory at that path of an NFSv3 server's export (made on first
    /// write), reached on the ports given or, by default, those the
    /// server's portmapper (port 111) names.
    Nfs(Server),
}

/// Why a target cannot be used; each says what to fix.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TargetError {
    #[error("invalid backup target URL {0:?}: {1}")]
    Url(String, &'static str),
    #[error("credential Secret {0}: {1}")]
    Credentials(String, String),
    #[error("{0}")]
    Store(String),
}

impl TargetUrl {
    pub fn parse(url: &str) -> Result<Self, TargetError> {
        let bad = |why| TargetError::Url(url.to_owned(), why);
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        match scheme {
            "s3" | "azblob" => {
                let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
                let (name, place) = authority
                    .split_once('@')
                    .filter(|(n, p)| !n.is_empty() && !p.is_empty())
                    .ok_or_else(|| bad("expected <bucket or container>@<region or account>"))?;
                let path = path.trim_matches('/').to_owned();
                Path::parse(&path).map_err(|_| bad("the path is not a valid object path"))?;
                Ok(if scheme == "s3" {
                    Self::S3 {
                        bucket: name.into(),
                        region: place.into(),
                        path,
                    }
                } else {
                    Self::Azure {
                        container: name.into(),
                        account: place.into(),
                        path,
                    }
                })
            }
            "file" => {
                if !rest.starts_with('/') || rest.split('/').any(|part| part == "..") {
                    return Err(bad("file:// needs an absolute path without .."));
                }
                Ok(Self::File { dir: rest.into() })
            }
            "nfs" => parse_nfs(rest).map(Self::Nfs).map_err(bad),
            _ => Err(bad("the scheme must be s3, azblob, file or nfs")),
        }
    }
}

/// What follows `nfs://`: `server:/path`, the server a host name, an IPv4
/// address or an IPv6 one in brackets, and the ports as query keys.
fn parse_nfs(rest: &str) -> Result<Server, &'static str> {
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (host, path) = location
        .split_once(":/")
        .filter(|(host, _)| !host.is_empty() && !host.contains('/'))
        .ok_or("expected nfs://server:/export")?;
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.iter().any(|p| *p == "." || *p == "..") {
        return Err("the export path must not hold . or ..");
    }
    let mut server = Server {
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
        path: format!("/{}", parts.join("/")),
        nfs_port: None,
        mount_port: None,
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let port = value
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or("nfsport and mountport must be port numbers");
        match key {
            "nfsport" => server.nfs_port = Some(port?),
            "mountport" => server.mount_port = Some(port?),
            _ => return Err("the only query keys of nfs:// are nfsport and mountport"),
        }
    }
    Ok(server)
}

/// The backup store `url` names, reached with the credentials in `secret`
/// (the data of Secret `secret_name`).
pub fn open(
    url: &str,
    secret_name: &str,
    secret: &BTreeMap<String, String>,
) -> Result<Backupstore, TargetError> {
    let store_error = |e: object_store::Error| TargetError::Store(e.to_string());
    let missing =
        |key: &str| TargetError::Credentials(secret_name.to_owned(), format!("{key} is required"));
    let (store, path): (Arc<dyn ObjectStore>, String) = match TargetUrl::parse(url)? {
        TargetUrl::S3 {
            bucket,
            region,
            path,
        } => {
            crypto_provider();
            let key = secret
                .get(AWS_ACCESS_KEY_ID)
                .ok_or_else(|| missing(AWS_ACCESS_KEY_ID))?;
            let secret_key = secret
                .get(AWS_SECRET_ACCESS_KEY)
                .ok_or_else(|| missing(AWS_SECRET_ACCESS_KEY))?;
            let mut builder = AmazonS3Builder::new()
                .with_bucket_name(bucket)
                .with_region(region)
                .with_access_key_id(key)
                .with_secret_access_key(secret_key)
                .with_client_options(client_options(secret, secret_name, AWS_CERT)?);
            if let Some(endpoint) = secret.get(AWS_ENDPOINTS) {
                builder = builder
                    .with_endpoint(endpoint)
                    .with_allow_http(endpoint.starts_with("http://"));
            }
            (Arc::new(builder.build().map_err(store_error)?), path)
        }
        TargetUrl::Azure {
            container,
            account,
            path,
        } => {
            crypto_provider();
            let mut builder = MicrosoftAzureBuilder::new()
                .with_account(account)
                .with_container_name(container)
                .with_client_options(client_options(secret, secret_name, "")?);
            builder = match (secret.get(AZBLOB_ACCOUNT_KEY), secret.get(AZBLOB_SAS)) {
                (Some(key), _) => builder.with_access_key(key),
                (None, Some(sas)) => builder.with_config(
                    object_store::azure::AzureConfigKey::SasKey,
                    sas.trim_start_matches('?'),
                ),
                (None, None) => return Err(missing("AZBLOB_ACCOUNT_KEY or AZBLOB_SAS")),
            };
            if let Some(endpoint) = secret.get(AZBLOB_ENDPOINT) {
                builder = builder
                    .with_endpoint(endpoint.clone())
                    .with_allow_http(endpoint.starts_with("http://"));
            }
            (Arc::new(builder.build().map_err(store_error)?), path)
        }
        TargetUrl::File { dir } => {
            if !dir.is_dir() {
                let message = format!("directory {} does not exist", dir.display());
                return Err(TargetError::Store(message));
            }
            let local = LocalFileSystem::new_with_prefix(&dir).map_err(store_error)?;
            (Arc::new(local), String::new())
        }
        TargetUrl::Nfs(server) => (Arc::new(NfsStore::new(server)), String::new()),
    };
    Ok(Backupstore::new(store, Path::from(path)))
}

/// The HTTP client's options: the CA bundle under `cert_key`, if any.
fn client_options(
    secret: &BTreeMap<String, String>,
    secret_name: &str,
    cert_key: &str,
) -> Result<object_store::ClientOptions, TargetError> {
    let mut options = object_store::ClientOptions::new();
    if let Some(pem) = secret.get(cert_key) {
        let certificates =
            object_store::Certificate::from_pem_bundle(pem.as_bytes()).map_err(|e| {
                TargetError::Credentials(secret_name.to_owned(), format!("{cert_key}: {e}"))
            })?;
        for certificate in certificates {
            options = options.with_root_certificate(certificate);
        }
    }
    Ok(options)
}

/// reqwest is built without a crypto provider of its own (it would build
/// aws-lc); ring, which kube's TLS uses too, is the process's.
fn crypto_provider() {
    // Err: one is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_each_kind_parse() {
        assert_eq!(
            TargetUrl::parse("s3://backups@us-east-1/cluster/a").unwrap(),
            TargetUrl::S3 {
                bucket: "backups".into(),
                region: "us-east-1".into(),
                path: "cluster/a".into()
            }
        );
        assert_eq!(
            TargetUrl::parse("azblob://c@acct/").unwrap(),
            TargetUrl::Azure {
                container: "c".into(),
                account: "acct".into(),
                path: String::new()
            }
        );
        assert_eq!(
            TargetUrl::parse("file:///var/backups").unwrap(),
            TargetUrl::File {
                dir: "/var/backups".into()
            }
        );
        assert_eq!(
            TargetUrl::parse("nfs://10.0.0.1:/exports/b").unwrap(),
            TargetUrl::Nfs(Server {
                host: "10.0.0.1".into(),
                path: "/exports/b".into(),
                nfs_port: None,
                mount_port: None,
            })
        );
    }

    #[test]
    fn nfs_urls_take_a_directory_in_the_export_and_ports() {
        let nfs = |url| match TargetUrl::parse(url).unwrap() {
            TargetUrl::Nfs(server) => server,
            other => panic!("{url}: {other:?}"),
        };
        let server = nfs("nfs://nas.local:/export/cluster-a/?nfsport=2049&mountport=20048");
        assert_eq!(server.host, "nas.local");
        assert_eq!(server.path, "/export/cluster-a");
        assert_eq!(
            (server.nfs_port, server.mount_port),
            (Some(2049), Some(20048))
        );
        let server = nfs("nfs://[fd00::1]:/srv//nfs?nfsport=2049");
        assert_eq!(
            (server.host.as_str(), server.path.as_str()),
            ("fd00::1", "/srv/nfs")
        );
        assert_eq!((server.nfs_port, server.mount_port), (Some(2049), None));
        assert_eq!(nfs("nfs://10.0.0.1:/").path, "/");
    }

    #[test]
    fn malformed_urls_say_what_is_wrong() {
        for (url, why) in [
            ("backups", "no scheme"),
            ("s3://bucket/path", "expected <bucket"),
            ("s3://@region", "expected <bucket"),
            ("file://relative", "absolute path"),
            ("file:///a/../etc", "absolute path"),
            ("gs://bucket@x", "the scheme must be"),
            ("nfs://server/export", "expected nfs://"),
            ("nfs://:/export", "expected nfs://"),
            ("nfs://server:/a/../b", "must not hold . or .."),
            ("nfs://server:/e?port=1", "the only query keys"),
            ("nfs://server:/e?nfsport=0", "port numbers"),
            ("nfs://server:/e?mountport=x", "port numbers"),
        ] {
            let error = TargetUrl::parse(url).unwrap_err().to_string();
            assert!(error.contains(why), "{url}: {error}");
        }
    }

    #[test]
    fn missing_credentials_name_the_key_and_never_a_value() {
        let secret = BTreeMap::from([(AWS_ACCESS_KEY_ID.to_owned(), "AKIA-SECRETISH".to_owned())]);
        let Err(error) = open("s3://b@r/p", "creds", &secret) else {
            panic!("opened without a secret key");
        };
        let error = error.to_string();
        assert!(
            error.contains("creds") && error.contains(AWS_SECRET_ACCESS_KEY),
            "{error}"
        );
        assert!(!error.contains("AKIA-SECRETISH"), "{error}");
        let Err(error) = open("azblob://c@a", "creds", &BTreeMap::new()) else {
            panic!("opened without a key");
        };
        assert!(error.to_string().contains(AZBLOB_ACCOUNT_KEY), "{error}");
    }

    #[test]
    fn an_nfs_target_opens_without_reaching_its_server() {
        let opened = open(
            "nfs://192.0.2.1:/export?nfsport=2049&mountport=2050",
            "",
            &BTreeMap::new(),
        );
        assert!(opened.is_ok(), "the server is reached on first use");
    }

    #[test]
    fn a_file_target_needs_its_directory() {
        let Err(error) = open("file:///nonexistent/oxhorn-backups", "", &BTreeMap::new()) else {
            panic!("opened a missing directory");
        };
        assert!(error.to_string().contains("does not exist"), "{error}");
    }
}
