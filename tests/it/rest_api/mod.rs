//! The REST API (`/v1`) of the managers, against the real API server: who
//! may do what is its RBAC's answer for each caller's own token (a
//! ServiceAccount's, as `kubectl create token` gives), and bad requests get
//! the API's error body.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::PolicyRule;
use oxhorn::api::volumes::{VolumeList, VolumeView};
use oxhorn::types::Volume;
use serde_json::Value;

use crate::common::{Cluster, MIB};

mod backups;
mod nodes;
mod support_bundle;
mod volumes;
pub mod workload;

/// What an account may do: `verbs` on `resources` of the API `group`
/// (`""`: the core group), in the test's namespace.
pub struct Rule<'a> {
    pub group: &'a str,
    pub resources: &'a [&'a str],
    pub verbs: &'a [&'a str],
}

/// `verbs` on oxhorn.io's `resources`.
pub fn oxhorn<'a>(resources: &'a [&'a str], verbs: &'a [&'a str]) -> Rule<'a> {
    Rule {
        group: "oxhorn.io",
        resources,
        verbs,
    }
}

/// Reading everything of oxhorn's.
pub const READ: &[&str] = &["get", "list", "watch"];

/// A ServiceAccount of the test's namespace allowed `verbs` on volumes
/// (none: not bound to anything), and a token of it.
async fn account(cluster: &Cluster, name: &str, verbs: &[&str]) -> String {
    match verbs {
        [] => account_with(cluster, name, &[]).await,
        verbs => account_with(cluster, name, &[oxhorn(&["volumes"], verbs)]).await,
    }
}

/// A ServiceAccount of the test's namespace allowed what `rules` say (none:
/// not bound to anything), and a token of it.
pub async fn account_with(cluster: &Cluster, name: &str, rules: &[Rule<'_>]) -> String {
    let strings = |s: &[&str]| s.iter().map(|v| (*v).to_owned()).collect::<Vec<_>>();
    let rules = rules.iter().map(|rule| PolicyRule {
        api_groups: Some(vec![rule.group.into()]),
        resources: Some(strings(rule.resources)),
        verbs: strings(rule.verbs),
        ..PolicyRule::default()
    });
    let client = cluster.api::<ServiceAccount>().into_client();
    oxhorn_testbed::account_token(&client, cluster.ns.name(), name, rules.collect())
        .await
        .unwrap()
}

/// The API of the cluster's first node.
pub struct Client {
    pub base: String,
    http: reqwest::Client,
}

impl Client {
    pub fn new(cluster: &Cluster) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let address = cluster.nodes[0]
            .api_address()
            .expect("the node serves the API");
        Self {
            base: format!("http://{address}"),
            http: reqwest::Client::new(),
        }
    }

    /// `method` on `path` with `token`: the status and the body, as JSON.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
    ) -> (u16, Value) {
        self.send(method, path, token, None).await
    }

    /// `method` on `path` with `token` and the JSON `body`: the status and
    /// the body, as JSON.
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        (status, body)
    }

    /// GET `path` with `token`: the status, the headers and the body.
    pub async fn get_bytes(
        &self,
        path: &str,
        token: &str,
    ) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
        let request = self.http.get(format!("{}{path}", self.base));
        let response = request.bearer_auth(token).send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        (status, headers, response.bytes().await.unwrap().to_vec())
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, token).await
    }

    pub async fn post(&self, path: &str, token: &str, body: &Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, Some(token), Some(body))
            .await
    }
}

/// The error body's code, checked to have a message too.
pub fn code(body: &Value) -> &str {
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    body["code"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_caller_may_do_what_their_rbac_allows_and_no_more() {
    let cluster = Cluster::start("rest", 1).await;
    for name in ["vol-a", "vol-b", "vol-c"] {
        cluster.create_volume(name, 16 * MIB, 1).await;
    }
    let reader = account(&cluster, "reader", &["get", "list"]).await;
    let nobody = account(&cluster, "nobody", &[]).await;
    let admin = account(&cluster, "admin", &["get", "list", "delete"]).await;
    let api = Client::new(&cluster);

    // No token, a token the API server never issued: 401.
    for token in [None, Some("not-a-token")] {
        let (status, body) = api.get("/v1/volumes", token).await;
        assert_eq!((status, code(&body)), (401, "unauthenticated"), "{body}");
        assert!(!body.to_string().contains("not-a-token"), "{body}");
    }
    // A valid token without the right: 403, naming what was refused.
    let (status, body) = api.get("/v1/volumes", Some(&nobody)).await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("list volumes.oxhorn.io"), "{message}");
    assert!(message.contains(":nobody"), "{message}");

    // The reader lists, a page at a time (once the manager's caches hold
    // all three), and gets one.
    let page = cluster
        .until("the API lists the three volumes", || async {
            let (status, body) = api.get("/v1/volumes?limit=2", Some(&reader)).await;
            assert_eq!(status, 200, "{body}");
            let page: VolumeList = serde_json::from_value(body).unwrap();
            (page.total == 3).then_some(page)
        })
        .await;
    let names: Vec<_> = page.items.iter().map(|v| v.name.as_str()).collect();
    assert_eq!((names, page.total), (vec!["vol-a", "vol-b"], 3));
    let next = page.r#continue.expect("a next page");
    let (_, body) = api
        .get(
            &format!("/v1/volumes?limit=2&continue={next}"),
            Some(&reader),
        )
        .await;
    let page: VolumeList = serde_json::from_value(body).unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].name, "vol-c");
    assert!(page.r#continue.is_none());
    let (status, body) = api.get("/v1/volumes/vol-b", Some(&reader)).await;
    assert_eq!(status, 200, "{body}");
    let volume: VolumeView = serde_json::from_value(body).unwrap();
    assert_eq!((volume.size, volume.replicas_wanted), (16 * MIB, 1));
    let (status, body) = api.get("/v1/volumes/nope", Some(&reader)).await;
    assert_eq!((status, code(&body)), (404, "not_found"), "{body}");

    // Bad queries: 400 with the API's body.
    for query in ["limit=0", "limit=many", "bogus=1"] {
        let (status, body) = api
            .get(&format!("/v1/volumes?{query}"), Some(&reader))
            .await;
        assert_eq!((status, code(&body)), (400, "invalid"), "{query}: {body}");
    }

    // The reader may not delete; the admin may, and the volume goes.
    let delete = reqwest::Method::DELETE;
    let (status, body) = api
        .call(delete.clone(), "/v1/volumes/vol-a", Some(&reader))
        .await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");
    assert!(
        cluster
            .api::<Volume>()
            .get_opt("vol-a")
            .await
            .unwrap()
            .is_some()
    );
    let (status, body) = api.call(delete, "/v1/volumes/vol-a", Some(&admin)).await;
    assert_eq!(status, 202, "{body}");
    cluster
        .until("vol-a deleted", || async {
            let gone = cluster
                .api::<Volume>()
                .get_opt("vol-a")
                .await
                .unwrap()
                .is_none();
            gone.then_some(())
        })
        .await;
    for name in ["vol-b", "vol-c"] {
        cluster.delete_volume(name).await;
    }
}

/// The document describing the API is served to anyone, and is the one
/// docs/api/openapi.json holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_served() {
    let cluster = Cluster::start("openapi", 1).await;
    let api = Client::new(&cluster);
    let (status, body) = api.get("/v1/openapi.json", None).await;
    assert_eq!(status, 200);
    assert_eq!(body, serde_json::to_value(oxhorn::api::openapi()).unwrap());
    assert!(
        body["paths"]["/v1/volumes/{name}"]["delete"].is_object(),
        "{body}"
    );
    let (status, body) = api.get("/v1/nothing-here", None).await;
    assert_eq!((status, code(&body)), (404, "not_found"), "{body}");
    let (status, body) = api.call(reqwest::Method::PUT, "/v1/volumes", None).await;
    assert_eq!((status, code(&body)), (405, "method_not_allowed"), "{body}");
}
