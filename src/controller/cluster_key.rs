//! The key that admits the controllers, and the processes they start, to a
//! volume's data plane (see `protocol::auth`): one per cluster, kept in a
//! Secret that the first manager to start creates; each volume's key is
//! derived from it.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ObjectMeta};
use tracing::info;

use super::ControllerError;
use crate::datastore::create_if_absent;
use crate::protocol::Key;

/// The Secret, in the managers' namespace, holding the cluster's key.
pub const KEY_SECRET: &str = "oxhorn-data-plane-key";
const FIELD: &str = "key";

/// The cluster's data-plane key, made on first use.
pub async fn cluster_key(client: &Client, namespace: &str) -> Result<Key, ControllerError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    // Two rounds: another manager may create it between our get and create.
    for _ in 0..2 {
        if let Some(secret) = api.get_opt(KEY_SECRET).await? {
            return parse(&secret);
        }
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(KEY_SECRET.into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                FIELD.to_string(),
                ByteString(Key::generate().to_hex().into_bytes()),
            )])),
            type_: Some("Opaque".into()),
            ..Secret::default()
        };
        // None: another manager created it since our get.
        if let Some(created) = create_if_absent(&api, &secret).await? {
            info!(secret = KEY_SECRET, "created the cluster's data-plane key");
            return parse(&created);
        }
    }
    Err(ControllerError::DataPlaneKey(format!(
        "Secret {KEY_SECRET} was created and then vanished"
    )))
}

fn parse(secret: &Secret) -> Result<Key, ControllerError> {
    let invalid = |why: &str| {
        ControllerError::DataPlaneKey(format!("Secret {KEY_SECRET}, field {FIELD:?}: {why}"))
    };
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(FIELD))
        .ok_or_else(|| invalid("missing"))?;
    let text = std::str::from_utf8(&value.0).map_err(|_| invalid("not text"))?;
    Key::from_hex(text).map_err(|e| invalid(&e.to_string()))
}
