//! What controllers ask an instance to be, and the command line that makes it.

use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::InstanceError;
use crate::engine::FrontendKind;
use crate::frontend::iscsi::chap::ChapSecrets;
use crate::names;

/// Which process an instance runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InstanceKind {
    /// `oxhorn replica`: serves `volume`'s replica in `dir`.
    Replica {
        /// Empty in records written before replicas named their volume.
        #[serde(default)]
        volume: String,
        dir: PathBuf,
        size: u64,
    },
    /// `oxhorn engine`: replicates `volume` to `replicas` (data addresses)
    /// as engine generation `generation`.
    Engine {
        volume: String,
        #[serde(default)]
        generation: u64,
        size: u64,
        replicas: Vec<String>,
        #[serde(with = "frontend_serde")]
        frontend: FrontendKind,
        /// Serve even without the newest I/O path's replicas.
        #[serde(default)]
        salvage: bool,
        /// The CHAP credentials the iSCSI target asks for, handed over in
        /// the process's environment.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chap: Option<ChapSecrets>,
    },
}

impl InstanceKind {
    /// How many consecutive ports the process listens on: a replica's data
    /// port and its control port next to it, or an engine's control port
    /// and, with the iSCSI frontend, its iSCSI portal next to it.
    pub(super) fn port_count(&self) -> u16 {
        match self {
            InstanceKind::Replica { .. } => 2,
            InstanceKind::Engine {
                frontend: FrontendKind::Iscsi,
                ..
            } => 2,
            InstanceKind::Engine { .. } => 1,
        }
    }

    /// The environment the process takes its secrets from, besides its
    /// volume's data-plane key.
    pub(super) fn env(&self) -> Vec<(String, String)> {
        match self {
            InstanceKind::Engine {
                chap: Some(chap), ..
            } => crate::engine::chap_env(chap),
            _ => Vec::new(),
        }
    }

    pub(super) fn noun(&self) -> &'static str {
        match self {
            InstanceKind::Replica { .. } => "replica",
            InstanceKind::Engine { .. } => "engine",
        }
    }

    /// The volume the process serves.
    pub(super) fn volume(&self) -> &str {
        match self {
            InstanceKind::Replica { volume, .. } | InstanceKind::Engine { volume, .. } => volume,
        }
    }

    /// The volume whose FUSE mount and loop device the process leaves behind
    /// if it dies without stopping its frontend.
    pub(super) fn fuse_volume(&self) -> Option<&str> {
        match self {
            InstanceKind::Engine {
                volume,
                frontend: FrontendKind::Fuse,
                ..
            } => Some(volume),
            _ => None,
        }
    }
}

/// An instance: a name unique on the node and its process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceRequest {
    pub name: String,
    pub kind: InstanceKind,
}

impl InstanceRequest {
    /// Refuses names that could not safely become file names (the record,
    /// the log, the engine's mount point).
    pub(super) fn validate(&self) -> Result<(), InstanceError> {
        names::validate_dns_subdomain("instance name", &self.name)
            .map_err(InstanceError::InvalidName)?;
        names::validate_dns_subdomain("volume name", self.kind.volume())
            .map_err(InstanceError::InvalidName)?;
        Ok(())
    }

    /// The arguments of `oxhorn` that run this instance on `ip:port`.
    pub(super) fn args(
        &self,
        ip: IpAddr,
        port: u16,
        run_dir: &Path,
        dev_dir: &Path,
    ) -> Vec<OsString> {
        let listen = SocketAddr::new(ip, port).to_string();
        // The subcommand is named like the kind.
        let mut args: Vec<OsString> = vec![self.kind.noun().into()];
        let mut push = |flag: &str, value: &dyn AsRef<std::ffi::OsStr>| {
            args.push(flag.into());
            args.push(value.as_ref().to_owned());
        };
        match &self.kind {
            InstanceKind::Replica { volume, dir, size } => {
                push("--volume", volume);
                push("--dir", dir);
                push("--size", &size.to_string());
                push("--listen", &listen);
            }
            InstanceKind::Engine {
                volume,
                generation,
                size,
                replicas,
                frontend,
                salvage: _,
                chap: _,
            } => {
                push("--volume", volume);
                push("--generation", &generation.to_string());
                push("--size", &size.to_string());
                for replica in replicas {
                    push("--replica", replica);
                }
                push("--frontend", &frontend_serde::name(*frontend));
                push("--listen", &listen);
                if *frontend == FrontendKind::Iscsi {
                    let portal = SocketAddr::new(ip, port + 1).to_string();
                    push("--iscsi-listen", &portal);
                }
                push("--run-dir", &run_dir);
                push("--dev-dir", &dev_dir);
            }
        }
        if let InstanceKind::Engine { salvage: true, .. } = &self.kind {
            args.push("--salvage".into());
        }
        args
    }
}

/// `FrontendKind` as its command-line value ("fuse", "none"): the engine
/// module owns the type and gives it no serde implementation.
mod frontend_serde {
    use serde::{Deserialize, Deserializer, Serializer, de};

    use crate::engine::FrontendKind;

    pub fn name(kind: FrontendKind) -> &'static str {
        match kind {
            FrontendKind::Fuse => "fuse",
            FrontendKind::Iscsi => "iscsi",
            FrontendKind::None => "none",
        }
    }

    pub fn serialize<S: Serializer>(kind: &FrontendKind, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(name(*kind))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<FrontendKind, D::Error> {
        let value = String::deserialize(deserializer)?;
        match value.as_str() {
            "fuse" => Ok(FrontendKind::Fuse),
            "iscsi" => Ok(FrontendKind::Iscsi),
            "none" => Ok(FrontendKind::None),
            other => Err(de::Error::unknown_variant(
                other,
                &["fuse", "iscsi", "none"],
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn engine() -> InstanceRequest {
        InstanceRequest {
            name: "vol-e".into(),
            kind: InstanceKind::Engine {
                volume: "vol".into(),
                generation: 3,
                size: 8192,
                replicas: vec!["10.0.0.1:1000".into(), "10.0.0.2:1000".into()],
                frontend: FrontendKind::None,
                salvage: false,
                chap: None,
            },
        }
    }

    #[test]
    fn chap_secrets_go_to_the_environment_never_the_command_line() {
        use crate::frontend::iscsi::chap::Credential;

        let mut request = engine();
        let credential = |user: &str, secret: &str| Credential {
            user: user.into(),
            secret: secret.into(),
        };
        if let InstanceKind::Engine { chap, frontend, .. } = &mut request.kind {
            *frontend = FrontendKind::Iscsi;
            *chap = Some(ChapSecrets {
                initiator: credential("node", "initiator-secret"),
                target: Some(credential("target", "target-secret-1")),
            });
        }
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let args = request.args(ip, 2000, Path::new("/run"), Path::new("/dev"));
        assert!(!format!("{args:?}").contains("secret"), "{args:?}");
        assert!(!format!("{request:?}").contains("-secret"), "{request:?}");
        let env = request.kind.env();
        let names: Vec<&str> = env.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            [
                "OXHORN_ISCSI_CHAP_USER",
                "OXHORN_ISCSI_CHAP_SECRET",
                "OXHORN_ISCSI_CHAP_TARGET_USER",
                "OXHORN_ISCSI_CHAP_TARGET_SECRET"
            ]
        );
        assert_eq!(env[1].1, "initiator-secret");
        assert!(engine().kind.env().is_empty());
    }

    #[test]
    fn engine_command_line() {
        let args = engine().args(
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3)),
            2000,
            Path::new("/run/ox"),
            Path::new("/dev/ox"),
        );
        let args: Vec<_> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args.join(" "),
            "engine --volume vol --generation 3 --size 8192 --replica 10.0.0.1:1000 --replica 10.0.0.2:1000 \
             --frontend none --listen 10.0.0.3:2000 --run-dir /run/ox --dev-dir /dev/ox"
        );
    }

    #[test]
    fn an_iscsi_engine_takes_the_port_after_its_control_port_for_its_portal() {
        let mut request = engine();
        if let InstanceKind::Engine { frontend, .. } = &mut request.kind {
            *frontend = FrontendKind::Iscsi;
        }
        assert_eq!(request.kind.port_count(), 2);
        assert_eq!(engine().kind.port_count(), 1);
        let args = request.args(
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3)),
            2000,
            Path::new("/run/ox"),
            Path::new("/dev/ox"),
        );
        let args: Vec<_> = args.iter().map(|a| a.to_str().unwrap()).collect();
        let line = args.join(" ");
        assert!(
            line.contains("--frontend iscsi --listen 10.0.0.3:2000 --iscsi-listen 10.0.0.3:2001"),
            "{line}"
        );
        let json = serde_json::to_string(&request).expect("serialize");
        assert!(json.contains(r#""frontend":"iscsi""#), "{json}");
    }

    #[test]
    fn a_salvaging_engine_says_so_on_its_command_line() {
        let mut request = engine();
        if let InstanceKind::Engine { salvage, .. } = &mut request.kind {
            *salvage = true;
        }
        let args = request.args(
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3)),
            2000,
            Path::new("/run/ox"),
            Path::new("/dev/ox"),
        );
        assert_eq!(args.iter().filter(|a| *a == "--salvage").count(), 1);
        assert!(
            !engine()
                .args(
                    IpAddr::V4(Ipv4Addr::LOCALHOST),
                    2000,
                    Path::new("/r"),
                    Path::new("/d")
                )
                .iter()
                .any(|a| a == "--salvage")
        );
    }

    #[test]
    fn replica_command_line() {
        let request = InstanceRequest {
            name: "r".into(),
            kind: InstanceKind::Replica {
                volume: "vol".into(),
                dir: "/data/r".into(),
                size: 4096,
            },
        };
        let args = request.args(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            3000,
            Path::new("/unused"),
            Path::new("/unused"),
        );
        let args: Vec<_> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args.join(" "),
            "replica --volume vol --dir /data/r --size 4096 --listen 127.0.0.1:3000"
        );
    }

    #[test]
    fn round_trips_through_json() {
        let request = engine();
        let json = serde_json::to_string(&request).expect("serialize");
        assert!(json.contains(r#""frontend":"none""#), "{json}");
        let back: InstanceRequest = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, request);
    }

    #[test]
    fn refuses_names_that_are_not_dns_subdomains() {
        let mut request = engine();
        request.name = "../x".into();
        assert!(matches!(
            request.validate(),
            Err(InstanceError::InvalidName(_))
        ));
        let mut request = engine();
        if let InstanceKind::Engine { volume, .. } = &mut request.kind {
            *volume = "Vol".into();
        }
        assert!(request.validate().is_err());
        assert!(engine().validate().is_ok());
    }
}
