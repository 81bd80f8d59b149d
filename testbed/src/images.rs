//! Container images for test nodes, built here: no registry is reachable, so
//! pods name local images with `imagePullPolicy: Never`.
//!
//! [`BUSYBOX`] holds Debian's static busybox and its applets; its default
//! command sleeps, which also makes it the nodes' pod sandbox ("pause")
//! image. It is an OCI image layout made with umoci and packed as an OCI
//! archive for `ctr images import`.

use std::path::{Path, PathBuf};

use crate::process::run;
use crate::{Error, Result};

/// The name pods use for the busybox image: [`BUSYBOX_REPOSITORY`] and the
/// archive's tag.
pub const BUSYBOX: &str = "oxhorn.test/busybox:1";
pub const BUSYBOX_REPOSITORY: &str = "oxhorn.test/busybox";
const BUSYBOX_BINARY: &str = "/bin/busybox";
/// The applets a test pod runs, linked to busybox.
const APPLETS: [&str; 14] = [
    "sh",
    "sleep",
    "cat",
    "echo",
    "ls",
    "sha256sum",
    "dd",
    "df",
    "stat",
    "sync",
    "test",
    "mkdir",
    "rm",
    "wc",
];

fn text(path: &Path) -> Result<&str> {
    path.to_str()
        .ok_or_else(|| Error::Failed(format!("{} is not UTF-8", path.display())))
}

/// Builds the busybox image as an OCI archive under `dir`; returns its path.
pub fn build_busybox(dir: &Path) -> Result<PathBuf> {
    let layout = dir.join("busybox-layout");
    let bundle = dir.join("busybox-bundle");
    let archive = dir.join("busybox.tar");
    let image = format!("{}:1", text(&layout)?);
    run("umoci", &["init", "--layout", text(&layout)?])?;
    run("umoci", &["new", "--image", &image])?;
    run("umoci", &["unpack", "--image", &image, text(&bundle)?])?;
    let bin = bundle.join("rootfs/bin");
    std::fs::create_dir_all(&bin).map_err(|e| Error::io(&bin, e))?;
    std::fs::create_dir_all(bundle.join("rootfs/tmp")).map_err(|e| Error::io(&bundle, e))?;
    let busybox = bin.join("busybox");
    std::fs::copy(BUSYBOX_BINARY, &busybox).map_err(|e| Error::io(BUSYBOX_BINARY, e))?;
    for applet in APPLETS {
        let link = bin.join(applet);
        std::os::unix::fs::symlink("busybox", &link).map_err(|e| Error::io(&link, e))?;
    }
    run("umoci", &["repack", "--image", &image, text(&bundle)?])?;
    run(
        "umoci",
        &[
            "config",
            "--image",
            &image,
            "--config.entrypoint",
            "/bin/sleep",
            "--config.cmd",
            "2147483647",
        ],
    )?;
    run("tar", &["-C", text(&layout)?, "-cf", text(&archive)?, "."])?;
    std::fs::remove_dir_all(&bundle).map_err(|e| Error::io(&bundle, e))?;
    std::fs::remove_dir_all(&layout).map_err(|e| Error::io(&layout, e))?;
    Ok(archive)
}

/// Imports the OCI archive `archive` into the containerd at `socket`, in
/// the namespace the CRI uses, as `repository` with the archive's tags.
pub fn import(socket: &Path, archive: &Path, repository: &str) -> Result<()> {
    ctr_import(socket, archive, &["--base-name", repository])
}

fn ctr_import(socket: &Path, archive: &Path, options: &[&str]) -> Result<()> {
    let mut args = vec![
        "--address",
        text(socket)?,
        "-n",
        "k8s.io",
        "images",
        "import",
    ];
    args.extend_from_slice(options);
    args.push(text(archive)?);
    run("ctr", &args).map(drop)
}

/// Where hack/build-image.sh leaves the archives of the product's image and
/// of the CSI sidecars' images: `$OXHORN_IMAGE_DIR`, default
/// `$OXHORN_CACHE/images`.
pub fn product_dir() -> PathBuf {
    std::env::var_os("OXHORN_IMAGE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::tools_dir().with_file_name("images"))
}

/// Imports every archive of [`product_dir`] into the containerd at
/// `socket`, each under the names it carries; an error saying to run
/// hack/build-image.sh when there are none.
pub fn import_product(socket: &Path) -> Result<()> {
    import_dir(socket, &product_dir(), Some("hack/build-image.sh"))
}

/// Imports every archive (`*.tar`) of `dir` into the containerd at `socket`,
/// each under the names it carries; an error when there are none, saying
/// to run `maker` if given.
pub fn import_dir(socket: &Path, dir: &Path, maker: Option<&str>) -> Result<()> {
    let hint = maker.map(|m| format!(": run {m}")).unwrap_or_default();
    let mut archives: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::Failed(format!("{}: {e}{hint}", dir.display())))?
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "tar"))
        .collect();
    if archives.is_empty() {
        return Err(Error::Failed(format!(
            "no image archives in {}{hint}",
            dir.display()
        )));
    }
    archives.sort();
    for archive in archives {
        ctr_import(socket, &archive, &[])?;
    }
    Ok(())
}
