//! Who is calling, and may they: each request's bearer token is
//! authenticated by the Kubernetes API server (a TokenReview), and each
//! call is authorized with a SubjectAccessReview for the same verb on the
//! same resource, as that user. So the API lets nobody do what their RBAC
//! would not let them do with `kubectl`.
//!
//! Both answers are kept for a few seconds, keyed by a hash of the token
//! (never the token itself); a refusal is never kept, so a permission just
//! granted works at once. Tokens appear in no log line and no error; what
//! the API server said of a failed review goes to the log, not the caller.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use tracing::{debug, warn};

use super::error::ApiError;
use super::{ApiState, session};

/// How long an answer of the API server's is kept.
const KEEP: Duration = Duration::from_secs(10);

/// Past this many kept answers, the expired ones go, and if that is not
/// enough, all of them: a bound on memory, whatever callers ask.
const KEPT_MAX: usize = 4096;

/// The longest bearer token taken (Kubernetes' are about 1 KiB).
const TOKEN_MAX: usize = 8 << 10;

/// How long a review may take before the request fails as unavailable.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// An authenticated caller.
#[derive(Clone, Debug)]
pub struct Caller {
    pub user: UserInfo,
    token: [u8; 32],
}

impl Caller {
    pub fn name(&self) -> &str {
        self.user.username.as_deref().unwrap_or("an unnamed user")
    }
}

/// Where a resource lives.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The managers' namespace, where oxhorn's own resources are.
    Oxhorn,
    Namespace(String),
    /// Cluster-scoped (PersistentVolumes).
    Cluster,
}

/// A verb on a resource, one object or all.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    pub verb: &'static str,
    pub group: &'static str,
    pub resource: &'static str,
    /// `log` of `pods/log`, say.
    pub subresource: Option<&'static str>,
    pub name: Option<String>,
    pub scope: Scope,
}

impl Access {
    /// `verb` on oxhorn.io's `resource`, one object or all.
    pub fn oxhorn(verb: &'static str, resource: &'static str, name: Option<&str>) -> Self {
        Self {
            verb,
            group: crate::types::GROUP,
            resource,
            subresource: None,
            name: name.map(str::to_owned),
            scope: Scope::Oxhorn,
        }
    }

    /// `verb` on the core group's `resource` in `scope`.
    pub fn core(
        verb: &'static str,
        resource: &'static str,
        scope: Scope,
        name: Option<&str>,
    ) -> Self {
        Self {
            verb,
            group: "",
            resource,
            subresource: None,
            name: name.map(str::to_owned),
            scope,
        }
    }

    /// The resource, as `kubectl` names it.
    fn resource_name(&self) -> String {
        let resource = match self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.to_owned(),
        };
        match self.group {
            "" => resource,
            group => format!("{resource}.{group}"),
        }
    }
}

/// Kept answers, by token hash.
#[derive(Default)]
struct Kept {
    users: HashMap<[u8; 32], (Instant, UserInfo)>,
    allowed: HashMap<([u8; 32], Access), Instant>,
}

impl Kept {
    fn trim(&mut self, now: Instant) {
        if self.users.len() + self.allowed.len() > KEPT_MAX {
            self.users
                .retain(|_, (at, _)| now.duration_since(*at) < KEEP);
            self.allowed.retain(|_, at| now.duration_since(*at) < KEEP);
        }
        if self.users.len() + self.allowed.len() > KEPT_MAX {
            self.users.clear();
            self.allowed.clear();
        }
    }
}

pub struct Auth {
    client: Client,
    namespace: String,
    kept: Mutex<Kept>,
}

impl Auth {
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            client,
            namespace: namespace.to_owned(),
            kept: Mutex::new(Kept::default()),
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        // Plain maps: a panic elsewhere cannot leave them torn.
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The user `token` belongs to, as the API server says.
    pub async fn authenticate(&self, token: &str) -> Result<Caller, ApiError> {
        let hash = *blake3::hash(token.as_bytes()).as_bytes();
        let now = Instant::now();
        if let Some((at, user)) = self.kept().users.get(&hash)
            && now.duration_since(*at) < KEEP
        {
            return Ok(Caller {
                user: user.clone(),
                token: hash,
            });
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let answer = reviewed("token", reviews.create(&PostParams::default(), &review)).await?;
        let status = answer.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => user,
            _ => {
                let why = status.error.unwrap_or_default();
                debug!(why, "a bearer token was refused");
                return Err(ApiError::Unauthenticated(
                    "the bearer token is not valid, or has expired".into(),
                ));
            }
        };
        let mut kept = self.kept();
        kept.trim(now);
        kept.users.insert(hash, (now, user.clone()));
        Ok(Caller { user, token: hash })
    }

    /// Whether `caller` may do `access`, as the API server says.
    pub async fn authorize(&self, caller: &Caller, access: &Access) -> Result<(), ApiError> {
        let now = Instant::now();
        let key = (caller.token, access.clone());
        if let Some(at) = self.kept().allowed.get(&key)
            && now.duration_since(*at) < KEEP
        {
            return Ok(());
        }
        let user = &caller.user;
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                uid: user.uid.clone(),
                groups: user.groups.clone(),
                extra: user.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(access.verb.to_owned()),
                    group: Some(access.group.to_owned()),
                    resource: Some(access.resource.to_owned()),
                    subresource: access.subresource.map(str::to_owned),
                    namespace: match &access.scope {
                        Scope::Oxhorn => Some(self.namespace.clone()),
                        Scope::Namespace(namespace) => Some(namespace.clone()),
                        Scope::Cluster => None,
                    },
                    name: access.name.clone(),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let reviews: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = reviewed("access", reviews.create(&PostParams::default(), &review)).await?;
        if !answer.status.is_some_and(|s| s.allowed) {
            return Err(ApiError::Forbidden {
                user: caller.name().to_owned(),
                verb: access.verb.to_owned(),
                resource: access.resource_name(),
                namespace: match &access.scope {
                    Scope::Namespace(namespace) => Some(namespace.clone()),
                    Scope::Oxhorn | Scope::Cluster => None,
                },
                name: access.name.clone(),
            });
        }
        let mut kept = self.kept();
        kept.trim(now);
        kept.allowed.insert(key, now);
        Ok(())
    }
}

impl Auth {
    /// Whether `caller` may do `access`: for what a page offers them.
    pub async fn allows(&self, caller: &Caller, access: &Access) -> bool {
        self.authorize(caller, access).await.is_ok()
    }
}

/// A review's answer, within [`REVIEW_TIMEOUT`]; why it failed goes to the
/// log, the caller hears only that the API server did not answer.
async fn reviewed<T>(
    what: &str,
    review: impl Future<Output = kube::Result<T>>,
) -> Result<T, ApiError> {
    let unavailable = || ApiError::Unavailable(format!("the {what} could not be reviewed"));
    match tokio::time::timeout(REVIEW_TIMEOUT, review).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(error)) => {
            warn!(what, %error, "a review failed");
            Err(unavailable())
        }
        Err(_) => {
            warn!(what, timeout = ?REVIEW_TIMEOUT, "a review took too long");
            Err(unavailable())
        }
    }
}

/// The bearer token of the request's `Authorization` header (the scheme's
/// name in any case, as HTTP has it).
fn bearer(parts: &Parts) -> Result<&str, ApiError> {
    let missing = || {
        ApiError::Unauthenticated(
            "a bearer token is needed: send `Authorization: Bearer <token>` with a Kubernetes token (`kubectl create token <service account>`)".into(),
        )
    };
    let header = parts.headers.get(AUTHORIZATION).ok_or_else(missing)?;
    let value = header.to_str().map_err(|_| missing())?;
    let (scheme, token) = value.split_once(' ').ok_or_else(missing)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(missing());
    }
    if token.len() > TOKEN_MAX {
        return Err(ApiError::Unauthenticated(format!(
            "the bearer token is longer than {TOKEN_MAX} bytes"
        )));
    }
    Ok(token)
}

impl FromRequestParts<Arc<ApiState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        let token = match bearer(parts) {
            Ok(token) => token,
            // The dashboard's browsers: their cookie, and for a change the
            // session's CSRF token.
            Err(missing) => {
                let token = session::cookie_token(parts).ok_or(missing)?;
                if !session::is_safe(&parts.method) && !session::carries_csrf(parts, token) {
                    return Err(ApiError::Csrf);
                }
                token
            }
        };
        if token.len() > TOKEN_MAX {
            return Err(ApiError::Unauthenticated(format!(
                "the bearer token is longer than {TOKEN_MAX} bytes"
            )));
        }
        state.auth.authenticate(token).await
    }
}

#[cfg(test)]
mod tests {
    use axum::http::Request;

    use super::*;

    fn parts(authorization: Option<&str>) -> Parts {
        let mut request = Request::builder().uri("/v1/volumes");
        if let Some(value) = authorization {
            request = request.header(AUTHORIZATION, value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn only_a_bearer_token_is_taken() {
        assert_eq!(bearer(&parts(Some("Bearer abc.def"))).unwrap(), "abc.def");
        assert_eq!(bearer(&parts(Some("bearer abc.def"))).unwrap(), "abc.def");
        let long = format!("Bearer {}", "a".repeat(TOKEN_MAX + 1));
        assert_eq!(
            bearer(&parts(Some(&long))).unwrap_err().code(),
            "unauthenticated"
        );
        for refused in [
            None,
            Some("Basic dXNlcjpwYXNz"),
            Some("Bearer "),
            Some("abc"),
        ] {
            let error = bearer(&parts(refused)).unwrap_err();
            assert_eq!(error.code(), "unauthenticated", "{refused:?}");
            assert!(!error.to_string().contains("dXNlcjpwYXNz"));
        }
    }
}
