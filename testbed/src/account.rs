//! A ServiceAccount and a token of it, as `kubectl create token` gives: the
//! caller the REST API and the dashboard are tested and measured as.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::Result;

/// A ServiceAccount `name` of namespace `ns` allowed what `rules` say
/// there (none: bound to nothing), and a token of it for an hour.
pub async fn account_token(
    client: &Client,
    ns: &str,
    name: &str,
    rules: Vec<PolicyRule>,
) -> Result<String> {
    let meta = || ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        ..ObjectMeta::default()
    };
    let post = PostParams::default();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let account = ServiceAccount {
        metadata: meta(),
        ..ServiceAccount::default()
    };
    accounts.create(&post, &account).await?;
    if !rules.is_empty() {
        let role = Role {
            metadata: meta(),
            rules: Some(rules),
        };
        Api::<Role>::namespaced(client.clone(), ns)
            .create(&post, &role)
            .await?;
        let binding = RoleBinding {
            metadata: meta(),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: name.into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: name.into(),
                namespace: Some(ns.into()),
                ..Subject::default()
            }]),
        };
        Api::<RoleBinding>::namespaced(client.clone(), ns)
            .create(&post, &binding)
            .await?;
    }
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let issued = accounts.create_token_request(name, &post, &request).await?;
    Ok(issued.status.map(|s| s.token).unwrap_or_default())
}
