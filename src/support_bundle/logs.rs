//! `logs/<pod>/<container>.log`: every container's log in oxhorn's
//! namespace (the managers, instance managers, CSI sidecars), timestamped,
//! since `--since` ago and at most `--log-limit` of it, the newest part;
//! and `<container>.previous.log`, the end of the container before its
//! last restart (its crash, most often), whenever it was.

use futures::AsyncReadExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::LogParams;
use kube::{Api, ResourceExt};

use super::archive::Stopped;
use super::collect::{Collection, why};
use super::report::Outcome;

/// How long one container's log may take to read.
const LOG_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// A log's newest part.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tail {
    kept: Vec<u8>,
    /// Bytes of the log dropped, the oldest, to keep within the limit.
    dropped: u64,
}

impl Tail {
    /// Adds `read`, dropping the oldest bytes past twice `limit` (so that
    /// dropping is rare).
    fn push(&mut self, read: &[u8], limit: usize) {
        self.kept.extend_from_slice(read);
        if self.kept.len() > limit.saturating_mul(2) {
            self.drop_to(limit);
        }
    }

    /// The newest `limit` bytes at most, from the start of a line.
    fn finish(mut self, limit: usize) -> Self {
        if self.kept.len() > limit {
            self.drop_to(limit);
        }
        if self.dropped > 0
            && let Some(end) = self.kept.iter().position(|b| *b == b'\n')
        {
            self.kept.drain(..=end);
            self.dropped += end as u64 + 1;
        }
        self
    }

    fn drop_to(&mut self, limit: usize) {
        let cut = self.kept.len() - limit;
        self.kept.drain(..cut);
        self.dropped += cut as u64;
    }
}

/// The newest `limit` bytes of the log `params` asks for.
async fn tail(api: &Api<Pod>, pod: &str, params: &LogParams, limit: usize) -> Result<Tail, String> {
    let mut stream = api.log_stream(pod, params).await.map_err(|e| why(&e))?;
    let mut tail = Tail::default();
    let mut buffer = vec![0; 64 << 10];
    loop {
        let read = stream
            .read(&mut buffer)
            .await
            .map_err(|e| format!("reading it: {e}"))?;
        if read == 0 {
            return Ok(tail.finish(limit));
        }
        tail.push(&buffer[..read], limit);
    }
}

/// A name the API server gave, as one component of a path.
fn component(name: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    let name: String = name
        .chars()
        .map(|c| if safe(c) { c } else { '_' })
        .collect();
    if name.is_empty() || name.chars().all(|c| c == '.') {
        return "_".into();
    }
    name
}

impl Collection<'_> {
    pub(super) async fn logs(&mut self, pods: &[Pod]) -> Result<(), Stopped> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.options.namespace);
        if pods.is_empty() {
            let why = "no pod in the namespace (or they could not be listed)";
            self.report.record("logs/", Outcome::Skipped(why.into()));
        }
        for pod in pods {
            let name = pod.name_any();
            if pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_none()
            {
                let why = "on no node yet: it has no log";
                self.report.record(
                    format!("logs/{}/", component(&name)),
                    Outcome::Skipped(why.into()),
                );
                continue;
            }
            for container in containers(pod) {
                self.log(&api, &name, &container, false).await?;
                if restarts(pod, &container) > 0 {
                    self.log(&api, &name, &container, true).await?;
                }
            }
        }
        Ok(())
    }

    /// One container's log, or its previous container's.
    async fn log(
        &mut self,
        api: &Api<Pod>,
        pod: &str,
        container: &str,
        previous: bool,
    ) -> Result<(), Stopped> {
        let suffix = if previous { "previous.log" } else { "log" };
        let path = format!("logs/{}/{}.{suffix}", component(pod), component(container));
        let since = i64::try_from(self.options.since.as_secs()).unwrap_or(i64::MAX);
        let params = LogParams {
            container: Some(container.to_owned()),
            previous,
            since_seconds: (!previous).then_some(since),
            timestamps: true,
            ..LogParams::default()
        };
        let limit = usize::try_from(self.options.log_limit).unwrap_or(usize::MAX);
        let read = match tokio::time::timeout(LOG_TIMEOUT, tail(api, pod, &params, limit)).await {
            Ok(read) => read,
            Err(_) => Err(format!("not read within {LOG_TIMEOUT:?}")),
        };
        let tail = match read {
            Ok(tail) => tail,
            Err(why) => {
                self.report.record(&path, Outcome::Failed(why));
                return Ok(());
            }
        };
        let kept = tail.kept.len();
        let outcome = match tail.dropped {
            0 => Outcome::Done(format!("{kept} bytes")),
            dropped => Outcome::Partial(format!(
                "the newest {kept} bytes; the oldest {dropped} dropped"
            )),
        };
        self.sink.file(&path, tail.kept, 0).await?;
        self.report.record(path, outcome);
        Ok(())
    }
}

/// The names of `pod`'s containers, the init containers first.
fn containers(pod: &Pod) -> Vec<String> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let init = spec.init_containers.iter().flatten();
    init.chain(&spec.containers)
        .map(|c| c.name.clone())
        .collect()
}

/// How many times `container` of `pod` restarted.
fn restarts(pod: &Pod, container: &str) -> i32 {
    let status = pod.status.as_ref();
    let statuses = status.into_iter().flat_map(|s| {
        let init = s.init_container_statuses.iter().flatten();
        init.chain(s.container_statuses.iter().flatten())
    });
    statuses
        .filter(|s| s.name == container)
        .map(|s| s.restart_count)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_lines_are_kept_within_the_limit() {
        let mut tail = Tail::default();
        for i in 0..100 {
            tail.push(format!("line {i:03}\n").as_bytes(), 25);
        }
        let tail = tail.finish(25);
        // 25 bytes from the end start mid-line: that line goes too.
        assert_eq!(tail.kept, b"line 098\nline 099\n");
        assert_eq!(tail.dropped, 900 - 18);

        let mut short = Tail::default();
        short.push(b"one\ntwo\n", 100);
        assert_eq!(
            short.finish(100),
            Tail {
                kept: b"one\ntwo\n".to_vec(),
                dropped: 0
            }
        );
    }

    #[test]
    fn names_become_one_safe_path_component() {
        assert_eq!(component("oxhorn-manager-x7k2p"), "oxhorn-manager-x7k2p");
        assert_eq!(component("../etc"), ".._etc");
        assert_eq!(component(".."), "_");
        assert_eq!(component(""), "_");
    }
}
