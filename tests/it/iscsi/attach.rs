//! A volume whose frontend is iSCSI, through the controllers: the engine
//! the instance manager starts on the attaching node serves the volume as
//! an iSCSI target, and the Engine reports its endpoint, which a real
//! initiator (libiscsi's tools) reaches. Staging it through the kernel is
//! what this machine cannot do (no iscsi_tcp module).

use std::process::Command;

use kube::ResourceExt;
use kube::api::PostParams;
use oxhorn::types::{Frontend, Node, Volume};
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
    let spec = json!({"size": SIZE, "numberOfReplicas": 2, "frontend": "iscsi"});
    let volume = Volume::new(VOLUME, serde_json::from_value(spec).unwrap());
    cluster
        .api::<Volume>()
        .create(&PostParams::default(), &volume)
        .await
        .unwrap();
    let node = cluster
        .until("the volume's replicas placed", || async {
            let replicas = cluster.replicas_of(VOLUME).await;
            let node = replicas.first()?.spec.instance.node_id.clone();
            (!node.is_empty()).then_some(node)
        })
        .await;

    let endpoint = cluster.attach(VOLUME, &node).await;
    let node_ip = cluster.node(&node).ip();
    let prefix = format!("iscsi://{node_ip}:");
    let suffix = format!("/iqn.2026-01.io.oxhorn:{VOLUME}/1");
    assert!(
        endpoint.starts_with(&prefix) && endpoint.ends_with(&suffix),
        "{endpoint} is not {prefix}<port>{suffix}"
    );
    let inquiry = libiscsi("iscsi-inq", &endpoint);
    assert!(inquiry.contains("DIRECT_ACCESS"), "{inquiry}");
    let capacity = libiscsi("iscsi-readcapacity16", &endpoint);
    assert!(
        capacity.contains(&format!("Total size:{SIZE}")),
        "{capacity}"
    );

    cluster.detach(VOLUME).await;
    let after = Command::new("iscsi-inq").arg(&endpoint).output().unwrap();
    assert!(
        !after.status.success(),
        "the target still answers after the detach"
    );
    cluster.delete_volume(VOLUME).await;
}
