//! A bundle's steps, in order, and what they share: each step's reads are
//! bounded in time and in number of objects, and a step that fails is
//! recorded and passed over.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, ObjectList};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::archive::{Sink, Stopped};
use super::redact::{Redactor, SCRUB_MIN, redact_json};
use super::report::{Outcome, Report};
use super::{Options, name, resources};

/// How long one read of the API server may take.
pub(super) const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// The most objects of one kind listed; past it, the bundle says so.
const OBJECTS_MAX: usize = 20_000;
/// Objects are listed this many at a time.
const PAGE: u32 = 500;

/// A collection under way.
pub(super) struct Collection<'a> {
    pub client: Client,
    pub options: &'a Options,
    pub sink: Sink,
    pub report: Report,
}

/// Writes a bundle to `out`, and says how its collection went. The error
/// is the archive's own (`out` could not be written): every collection
/// step's failure is in the bundle's `summary.txt` instead.
pub async fn write<W>(client: Client, options: Options, out: W) -> std::io::Result<Report>
where
    W: Write + Send + 'static,
{
    let secrets = resources::secrets(&client, &options.namespace).await;
    let redactor = match &secrets {
        Ok(secrets) => Redactor::new(secrets),
        Err(_) => Redactor::patterns_only(),
    };
    let report = Report {
        head: head(&options),
        steps: Vec::new(),
        redaction: redaction(&redactor, secrets.as_ref().map(Vec::len)),
    };
    let sink = Sink::start(out, name(options.created), Arc::new(redactor));
    let mut collection = Collection {
        client,
        options: &options,
        sink,
        report,
    };
    // Stopped: the archive's error tells why, below.
    let _ = collection.collect(secrets).await;
    let Collection { sink, report, .. } = collection;
    sink.finish(report.clone()).await?;
    Ok(report)
}

impl Collection<'_> {
    async fn collect(&mut self, secrets: Result<Vec<Secret>, String>) -> Result<(), Stopped> {
        let kubernetes = self.kubernetes(secrets).await?;
        self.versions(&kubernetes).await?;
        self.oxhorn_objects().await?;
        self.settings().await?;
        self.events(&kubernetes).await?;
        self.metrics(&kubernetes.pods).await?;
        self.logs(&kubernetes.pods).await
    }

    /// The value of `read`, or None once its failure is recorded as
    /// `what`'s (after [`READ_TIMEOUT`] at the latest).
    pub(super) async fn attempt<T>(
        &mut self,
        what: &str,
        read: impl Future<Output = Result<T, kube::Error>>,
    ) -> Option<T> {
        let failed = match tokio::time::timeout(READ_TIMEOUT, read).await {
            Ok(Ok(value)) => return Some(value),
            Ok(Err(error)) => why(&error),
            Err(_) => format!("no answer within {READ_TIMEOUT:?}"),
        };
        self.report.record(what, Outcome::Failed(failed));
        None
    }

    /// Writes `value` as YAML to `path`, recording `what` as `done`; `redacted`
    /// counts the redactions it has had.
    pub(super) async fn yaml(
        &mut self,
        path: &str,
        what: &str,
        value: &impl Serialize,
        redacted: usize,
        done: Outcome,
    ) -> Result<(), Stopped> {
        match serde_yaml_ng::to_string(value) {
            Ok(yaml) => {
                self.sink.file(path, yaml.into_bytes(), redacted).await?;
                self.report.record(what, done);
            }
            Err(error) => self
                .report
                .record(what, Outcome::Failed(format!("as YAML: {error}"))),
        }
        Ok(())
    }

    /// Writes `objects` to `path` as a List, as `kubectl get -o yaml`
    /// does, each redacted and without its managed fields; `capped` when
    /// more were there than listed.
    pub(super) async fn objects(
        &mut self,
        path: &str,
        what: &str,
        objects: Vec<Value>,
        capped: bool,
    ) -> Result<(), Stopped> {
        let count = objects.len();
        let mut redacted = 0;
        let items: Vec<Value> = objects
            .into_iter()
            .map(|mut object| {
                if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
                    metadata.remove("managedFields");
                }
                redacted += redact_json(&mut object);
                object
            })
            .collect();
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        let done = if capped {
            Outcome::Partial(format!("only the first {count}: there are more"))
        } else {
            Outcome::Done(format!("{count} objects"))
        };
        self.yaml(path, what, &list, redacted, done).await
    }
}

/// Why a read failed, in a line: the API server's answer (a refusal
/// names the user and what they may not do), or the client's error.
pub(super) fn why(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => {
            format!(
                "the API server answered {}: {}",
                status.code, status.message
            )
        }
        other => other.to_string(),
    }
}

/// Every `K` `api` lists with `params`, a page at a time, at most
/// [`OBJECTS_MAX`]; and whether there were more.
pub(super) async fn list_all<K>(
    api: &Api<K>,
    params: ListParams,
) -> Result<(Vec<K>, bool), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut all = Vec::new();
    let mut params = params.limit(PAGE);
    loop {
        let page: ObjectList<K> = api.list(&params).await?;
        all.extend(page.items);
        match page.metadata.continue_ {
            Some(next) if !next.is_empty() => {
                if all.len() >= OBJECTS_MAX {
                    return Ok((all, true));
                }
                params = params.continue_token(&next);
            }
            _ => return Ok((all, false)),
        }
    }
}

/// `objects` as JSON values, for [`Collection::objects`].
pub(super) fn values<K: Serialize>(objects: &[K]) -> Vec<Value> {
    objects
        .iter()
        .filter_map(|o| serde_json::to_value(o).ok())
        .collect()
}

/// The summary's head: what, when, by whom, how.
fn head(options: &Options) -> Vec<String> {
    let since = jiff::SignedDuration::try_from(options.since).unwrap_or_default();
    vec![
        format!("name:      {}", name(options.created)),
        format!("created:   {}", options.created),
        format!("made by:   {}", options.made_by),
        format!("namespace: {}", options.namespace),
        format!(
            "logs:      each container's since {since:#} ago (a restarted one's previous container: its end), at most {} bytes of each, the newest",
            options.log_limit
        ),
    ]
}

/// How the bundle was redacted, `secrets` being how many Secrets were
/// read for it, or why none could be.
fn redaction(redactor: &Redactor, secrets: Result<usize, &String>) -> Vec<String> {
    let by_value = match secrets {
        Ok(count) => format!(
            "Every file is scrubbed of the values of the namespace's {count} Secrets ({} values, as they are, in base64, JSON-escaped and line by line); {} values shorter than {SCRUB_MIN} bytes are not, nor those of keys naming a user, account, endpoint, region or namespace.",
            redactor.scrubbed, redactor.too_short
        ),
        Err(why) => format!(
            "The namespace's Secrets could not be read ({why}): their values were NOT scrubbed by value, only the patterns below were applied. Look through the bundle before you send it."
        ),
    };
    vec![
        "Secrets are never written with their values: kubernetes/secrets.yaml has their names, types and keys.".into(),
        by_value,
        "In every object: fields named like a credential (password, token, secret access key, account key, private key, ...), env values whose name is one, and kubectl's last-applied-configuration of a Secret are <redacted>.".into(),
        "In all text: bearer tokens, JWTs (service account tokens), PEM private keys, and a value given after a credential's name (as name=value or name: value) are <redacted>.".into(),
    ]
}
