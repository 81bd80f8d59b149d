//! Who is calling, and may they: each request's bearer token is
//! authenticated by the Kubernetes API server (a TokenReview), and each
//! call is authorized with a SubjectAccessReview for the same verb on the
//! same resource, as that user. So the API lets nobody do what their RBAC
//! would not let them do with `kubectl`.
//!
//! Both answers are kept for a few seconds, keyed by a hash of the token
//! (never the token itself); a refusal is never kept, so a permission just
//! granted works at once. Tokens appear in no log line and no error.

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

use super::ApiState;
use super::error::ApiError;

/// How long an answer of the API server's is kept.
const KEEP: Duration = Duration::from_secs(10);

/// Past this many kept answers, the expired ones go.
const KEPT_MAX: usize = 4096;

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

/// A verb on a resource (of oxhorn.io, or core's for claims and volumes),
/// in the managers' namespace unless cluster-scoped.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    pub verb: &'static str,
    pub group: &'static str,
    pub resource: &'static str,
    pub name: Option<String>,
}

impl Access {
    /// `verb` on oxhorn.io's `resource`, one object or all.
    pub fn oxhorn(verb: &'static str, resource: &'static str, name: Option<&str>) -> Self {
        Self {
            verb,
            group: crate::types::GROUP,
            resource,
            name: name.map(str::to_owned),
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
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| ApiError::Unavailable(format!("reviewing the token: {e}")))?;
        let status = answer.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => user,
            _ => {
                let why = status
                    .error
                    .unwrap_or_else(|| "the token is not valid".into());
                return Err(ApiError::Unauthenticated(format!(
                    "the bearer token was refused: {why}"
                )));
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
                    namespace: Some(self.namespace.clone()),
                    name: access.name.clone(),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let reviews: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| ApiError::Unavailable(format!("reviewing the access: {e}")))?;
        if !answer.status.is_some_and(|s| s.allowed) {
            return Err(ApiError::Forbidden {
                user: caller.name().to_owned(),
                verb: access.verb.to_owned(),
                resource: format!("{}.{}", access.resource, access.group),
                name: access.name.clone(),
            });
        }
        let mut kept = self.kept();
        kept.trim(now);
        kept.allowed.insert(key, now);
        Ok(())
    }
}

/// The bearer token of the request's `Authorization` header.
fn bearer(parts: &Parts) -> Result<&str, ApiError> {
    let missing = || {
        ApiError::Unauthenticated(
            "a bearer token is needed: send `Authorization: Bearer <token>` with a Kubernetes token (`kubectl create token <service account>`)".into(),
        )
    };
    let header = parts.headers.get(AUTHORIZATION).ok_or_else(missing)?;
    let value = header.to_str().map_err(|_| missing())?;
    let token = value
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(missing)?;
    Ok(token)
}

impl FromRequestParts<Arc<ApiState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, Self::Rejection> {
        let token = bearer(parts)?;
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
