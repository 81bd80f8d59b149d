//! `oxhorn manifest`: deploy/oxhorn.yaml, the one file that installs Oxhorn
//! (`kubectl apply -f`), assembled from its one source each: the namespace,
//! the CRDs as the types generate them, then deploy/parts/*.yaml in order,
//! with the images named in deploy/images.env written in where a part says
//! `${NAME}`, and the host directories of [`HostDirs`] where it says
//! `${KUBELET_DIR}`, `${DATA_DIR}` or `${RUN_DIR}`. Also deploy/uninstall.yaml,
//! the Job that removes every volume before the manifest is deleted: a file
//! of its own, applied only then, since its account may delete any claim
//! and pod.

use std::path::PathBuf;

use crate::{Error, Result, types};

const IMAGES: &str = include_str!("../../deploy/images.env");
const NAMESPACE: &str = include_str!("../../deploy/parts/00-namespace.yaml");
const UNINSTALL: &str = include_str!("../../deploy/parts/90-uninstall.yaml");
/// After the CRDs, in this order.
const PARTS: [&str; 8] = [
    include_str!("../../deploy/parts/10-rbac-manager.yaml"),
    include_str!("../../deploy/parts/11-rbac-csi-controller.yaml"),
    include_str!("../../deploy/parts/12-rbac-snapshot-controller.yaml"),
    include_str!("../../deploy/parts/13-rbac-users.yaml"),
    include_str!("../../deploy/parts/20-instance-manager.yaml"),
    include_str!("../../deploy/parts/21-manager.yaml"),
    include_str!("../../deploy/parts/30-csi-controller.yaml"),
    include_str!("../../deploy/parts/40-classes.yaml"),
];

/// The `NAME=value` lines of deploy/images.env.
pub fn images() -> Vec<(&'static str, &'static str)> {
    IMAGES
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| line.split_once('='))
        .collect()
}

const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet";
const DEFAULT_DATA_DIR: &str = "/var/lib/oxhorn";
const DEFAULT_RUN_DIR: &str = "/var/run/oxhorn";

/// What `oxhorn manifest` prints.
#[derive(clap::Args, Clone, Debug)]
pub struct ManifestArgs {
    #[command(flatten)]
    pub dirs: HostDirs,
    /// Print deploy/uninstall.yaml instead.
    #[arg(long)]
    pub uninstall: bool,
}

impl ManifestArgs {
    pub fn yaml(&self) -> Result<String> {
        if self.uninstall {
            uninstall_yaml()
        } else {
            manifest_yaml_for(&self.dirs)
        }
    }
}

/// The node directories the DaemonSets use, each at the same path in the
/// containers as on the host: the kubelet hands the node plugin host paths,
/// and the manager runs mount and mkfs in the host's mount namespace on the
/// paths it sees. Distributions that move the kubelet's root (k0s,
/// microk8s) set `--kubelet-dir`.
#[derive(clap::Args, Clone, Debug)]
pub struct HostDirs {
    /// The kubelet's root directory (its --root-dir).
    #[arg(long, default_value = DEFAULT_KUBELET_DIR)]
    pub kubelet_dir: PathBuf,
    /// Where each node keeps its replicas and instance records.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Where each node's engines mount their FUSE files.
    #[arg(long, default_value = DEFAULT_RUN_DIR)]
    pub run_dir: PathBuf,
}

impl Default for HostDirs {
    fn default() -> Self {
        Self {
            kubelet_dir: DEFAULT_KUBELET_DIR.into(),
            data_dir: DEFAULT_DATA_DIR.into(),
            run_dir: DEFAULT_RUN_DIR.into(),
        }
    }
}

impl HostDirs {
    /// The `${NAME}` values, each an absolute path of characters that need
    /// no quoting in YAML (it is written into the text as it is).
    fn values(&self) -> Result<Vec<(&'static str, String)>> {
        [
            ("KUBELET_DIR", &self.kubelet_dir),
            ("DATA_DIR", &self.data_dir),
            ("RUN_DIR", &self.run_dir),
        ]
        .into_iter()
        .map(|(name, dir)| {
            let text = dir.to_str().unwrap_or_default().trim_end_matches('/');
            let plain = text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c));
            if dir.is_absolute() && plain && text.len() > 1 {
                Ok((name, text.to_string()))
            } else {
                Err(Error::Config(format!(
                    "{}: {name} must be an absolute path other than / of letters, digits and / . _ -",
                    dir.display()
                )))
            }
        })
        .collect()
    }
}

/// `part` with every `${NAME}` replaced by its value; an error naming one
/// that has none.
fn substitute(part: &str, values: &[(&str, String)]) -> Result<String> {
    let mut out = part.to_string();
    for (name, value) in values {
        out = out.replace(&format!("${{{name}}}"), value);
    }
    match out.find("${") {
        Some(at) => {
            let name: String = out[at + 2..].chars().take_while(|c| *c != '}').collect();
            Err(Error::Config(format!(
                "deploy/parts names ${{{name}}}, which neither deploy/images.env nor the host directories set"
            )))
        }
        None => Ok(out),
    }
}

fn image_values() -> Vec<(&'static str, String)> {
    images()
        .into_iter()
        .map(|(name, image)| (name, image.to_string()))
        .collect()
}

/// deploy/uninstall.yaml.
pub fn uninstall_yaml() -> Result<String> {
    let mut out = String::from(
        "# Removes every Oxhorn volume before `kubectl delete -f deploy/oxhorn.yaml`; see\n\
         # README.md. Generated by `oxhorn manifest --uninstall` from deploy/parts.\n---\n",
    );
    out.push_str(&substitute(UNINSTALL, &image_values())?);
    Ok(out)
}

/// The manifest as deploy/oxhorn.yaml holds it.
pub fn manifest_yaml() -> Result<String> {
    manifest_yaml_for(&HostDirs::default())
}

/// The manifest with the node directories `dirs`.
pub fn manifest_yaml_for(dirs: &HostDirs) -> Result<String> {
    let mut values = image_values();
    values.extend(dirs.values()?);
    let mut out = String::from(
        "# Oxhorn: `kubectl apply -f deploy/oxhorn.yaml`. Generated by `oxhorn manifest`\n\
         # from deploy/parts and deploy/images.env; edit those, not this file.\n---\n",
    );
    out.push_str(NAMESPACE);
    out.push_str(&types::crds_yaml()?);
    for part in PARTS {
        out.push_str("---\n");
        out.push_str(&substitute(part, &values)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_image_is_named_and_written_in() {
        let manifest = manifest_yaml().unwrap();
        assert!(!manifest.contains("${"), "an image left unset");
        for (name, image) in images() {
            assert!(name.ends_with("_IMAGE"), "{name}");
            assert!(manifest.contains(image), "{name}={image} is not used");
        }
    }

    #[test]
    fn a_part_naming_an_unknown_image_is_refused() {
        let error = substitute("image: ${NOPE_IMAGE}\n", &[]).unwrap_err();
        assert!(error.to_string().contains("${NOPE_IMAGE}"), "{error}");
    }

    #[test]
    fn host_directories_are_written_in_everywhere() {
        let dirs = HostDirs {
            kubelet_dir: "/var/lib/k0s/kubelet/".into(),
            ..HostDirs::default()
        };
        let manifest = manifest_yaml_for(&dirs).unwrap();
        assert!(
            !manifest.contains("/var/lib/kubelet"),
            "a default kubelet path left"
        );
        assert!(
            manifest.contains(
                "--kubelet-csi-path=/var/lib/k0s/kubelet/plugins/driver.oxhorn.io/csi.sock"
            )
        );
        let default = manifest_yaml().unwrap();
        assert_eq!(
            default.matches("/var/lib/kubelet").count(),
            manifest.matches("/var/lib/k0s/kubelet").count()
        );
    }

    #[test]
    fn a_host_directory_that_is_not_a_plain_absolute_path_is_refused() {
        for bad in ["relative/dir", "/", "/var/lib/x: y", "/tmp/$(reboot)"] {
            let dirs = HostDirs {
                data_dir: bad.into(),
                ..HostDirs::default()
            };
            let error = manifest_yaml_for(&dirs).unwrap_err().to_string();
            assert!(
                error.contains("DATA_DIR must be an absolute path"),
                "{bad}: {error}"
            );
        }
    }
}
