//! A volume whose frontend is iSCSI, through the controllers: the engine
//! the instance manager starts on the attaching node serves the volume as
//! an iSCSI target asking for the CHAP credentials of the Secret the volume
//! names, and the Engine reports its endpoint, which a real initiator
//! (libiscsi's tools) reaches with them. Staging it through the kernel is
//! what this machine cannot do (no iscsi_tcp module).

use std::process::Command;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::PostParams;
use oxhorn::types::{Frontend, Node};
use serde_json::json;

use crate::common::{Cluster, init_tracing, require_root};

const VOLUME: &str = "by-iscsi";
const SIZE: i64 = 64 << 20;

fn libiscsi(program: &str, url: &str) -> String {
    let output = Command::new(program).arg(url).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{program} {url}: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    text
}

#[tokio::test]
async fn an_iscsi_volume_attaches_and_its_engine_reports_the_endpoint_initiators_reach() {
    init_tracing();
    require_root();
    let cluster = Cluster::start_with_instance_managers("isc", 2).await;
    // Each node says which frontends it has: here FUSE, and no kernel
    // initiator for iSCSI, which staging would need.
    let nodes = cluster
        .api::<Node>()
        .list(&Default::default())
        .await
        .unwrap();
    for node in &nodes.items {
        let status = cluster
            .until("the node's frontends reported", || async {
                let node = cluster.api::<Node>().get(&node.name_any()).await.ok()?;
                let status = node.status?;
                (status.frontends.len() == 2).then_some(status)
            })
            .await;
        let of = |frontend| {
            status
                .frontends
                .iter()
                .find(|f| f.frontend == frontend)
                .unwrap()
        };
        assert!(of(Frontend::Fuse).supported, "{:?}", status.frontends);
        let iscsi = of(Frontend::Iscsi);
        assert!(
            !iscsi.supported && iscsi.reason.contains("iscsi"),
            "{iscsi:?}"
        );
    }
    // The volume names a CHAP Secret that does not exist yet.
    let spec = json!({"size": SIZE, "numberOfReplicas": 2, "frontend": "iscsi",
                      "chapSecret": CHAP_SECRET});
    cluster.create_volume_with(VOLUME, spec).await;
    let node = cluster
        .until("the volume's replicas placed", || async {
            let replicas = cluster.replicas_of(VOLUME).await;
            let node = replicas.first()?.spec.instance.node_id.clone();
            (!node.is_empty()).then_some(node)
        })
        .await;
    cluster
        .patch_volume(VOLUME, json!({"spec": {"nodeID": node}}))
        .await;
    let why = cluster
        .until("the engine says why it does not start", || async {
            let status = cluster.engine_of(VOLUME).await?.status?;
            let running = status
                .instance
                .conditions
                .iter()
                .find(|c| c.type_ == "Running")?;
            (running.reason == "ChapSecretUnusable").then(|| running.message.clone())
        })
        .await;
    assert!(
        why.contains(&format!("CHAP Secret {CHAP_SECRET} does not exist")),
        "{why}"
    );

    cluster
        .api::<Secret>()
        .create(&PostParams::default(), &chap_secret())
        .await
        .unwrap();
    let endpoint = cluster.attach(VOLUME, &node).await;
    let node_ip = cluster.node(&node).ip();
    let prefix = format!("iscsi://{node_ip}:");
    let suffix = format!("/iqn.2026-01.io.oxhorn:{VOLUME}/1");
    assert!(
        endpoint.starts_with(&prefix) && endpoint.ends_with(&suffix),
        "{endpoint} is not {prefix}<port>{suffix}"
    );
    // The target asks for the Secret's credentials and proves its own.
    let refused = Command::new("iscsi-inq").arg(&endpoint).output().unwrap();
    assert!(!refused.status.success(), "a login without CHAP was let in");
    let authenticated = format!(
        "{}?target_user={TARGET_USER}&target_password={TARGET_PASSWORD}",
        endpoint.replacen("iscsi://", &format!("iscsi://{USER}%{PASSWORD}@"), 1)
    );
    let inquiry = libiscsi("iscsi-inq", &authenticated);
    assert!(inquiry.contains("DIRECT_ACCESS"), "{inquiry}");
    let capacity = libiscsi("iscsi-readcapacity16", &authenticated);
    assert!(
        capacity.contains(&format!("Total size:{SIZE}")),
        "{capacity}"
    );

    cluster.detach(VOLUME).await;
    let after = Command::new("iscsi-inq")
        .arg(&authenticated)
        .output()
        .unwrap();
    assert!(
        !after.status.success(),
        "the target still answers after the detach"
    );
    cluster.delete_volume(VOLUME).await;
}

const CHAP_SECRET: &str = "by-iscsi-chap";
const USER: &str = "node-initiator";
const PASSWORD: &str = "initiator-secret";
const TARGET_USER: &str = "oxhorn-target";
const TARGET_PASSWORD: &str = "target-secret-1";

/// A `kubernetes.io/iscsi-chap` Secret for mutual CHAP.
fn chap_secret() -> Secret {
    serde_json::from_value(json!({
        "metadata": {"name": CHAP_SECRET},
        "type": "kubernetes.io/iscsi-chap",
        "stringData": {
            "node.session.auth.username": USER,
            "node.session.auth.password": PASSWORD,
            "node.session.auth.username_in": TARGET_USER,
            "node.session.auth.password_in": TARGET_PASSWORD,
        },
    }))
    .unwrap()
}
