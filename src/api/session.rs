//! The dashboard's sign-in: the token a user pasted once is kept in their
//! browser in an HttpOnly, Secure, SameSite=Strict cookie (as the
//! Kubernetes Dashboard keeps it), so the managers keep no sessions and
//! any of them answers. A request the cookie authenticates that changes
//! anything must also carry the session's CSRF token, which is derived
//! from the token itself: a page of another site can neither read the
//! cookie nor compute the CSRF token.

use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, header};

/// The cookie holding the token.
pub const COOKIE: &str = "oxhorn_session";

/// The header a state-changing request the cookie authenticates sends its
/// CSRF token in.
pub const CSRF_HEADER: &str = "x-oxhorn-csrf";

/// How long a browser keeps the cookie; the token's own expiry still holds.
const MAX_AGE_SECONDS: u32 = 8 * 3600;

/// The CSRF token of the session holding `token`.
pub fn csrf_token(token: &str) -> String {
    blake3::derive_key("oxhorn dashboard CSRF token v1", token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The token in the request's session cookie, if any.
pub fn cookie_token(parts: &Parts) -> Option<&str> {
    parts
        .headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
        .filter(|value| !value.is_empty())
}

/// Whether a request with `method` changes nothing, so needs no CSRF token.
pub fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Whether the request carries the CSRF token of the session of `token`,
/// compared in constant time.
pub fn carries_csrf(parts: &Parts, token: &str) -> bool {
    let sent = parts.headers.get(CSRF_HEADER).map(HeaderValue::as_bytes);
    let wanted = csrf_token(token);
    sent.is_some_and(|sent| {
        sent.len() == wanted.len()
            && sent
                .iter()
                .zip(wanted.as_bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    })
}

/// The `Set-Cookie` value that signs a browser in with `token`, or `None`
/// if the token holds what a cookie cannot (Kubernetes' tokens never do).
pub fn sign_in(token: &str) -> Option<HeaderValue> {
    let cookie_safe = |c: char| c.is_ascii_graphic() && !matches!(c, ';' | ',' | '"' | '\\');
    if !token.chars().all(cookie_safe) {
        return None;
    }
    let cookie = format!(
        "{COOKIE}={token}; Path=/; Max-Age={MAX_AGE_SECONDS}; HttpOnly; Secure; SameSite=Strict"
    );
    HeaderValue::from_str(&cookie).ok()
}

/// The `Set-Cookie` value that signs a browser out.
pub fn sign_out() -> HeaderValue {
    HeaderValue::from_static(
        "oxhorn_session=; Path=/; Max-Age=0; HttpOnly; Secure; SameSite=Strict",
    )
}

#[cfg(test)]
mod tests {
    use axum::http::Request;

    use super::*;

    fn parts(method: Method, headers: &[(&str, &str)]) -> Parts {
        let mut request = Request::builder().method(method).uri("/v1/volumes");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn the_token_is_found_among_other_cookies() {
        let cookies = [("cookie", "a=1; oxhorn_session=tok.en; b=2")];
        assert_eq!(cookie_token(&parts(Method::GET, &cookies)), Some("tok.en"));
        let none = [("cookie", "a=1; oxhorn_session=")];
        assert_eq!(cookie_token(&parts(Method::GET, &none)), None);
        assert_eq!(cookie_token(&parts(Method::GET, &[])), None);
    }

    #[test]
    fn a_change_needs_the_sessions_own_csrf_token() {
        let right = csrf_token("token-a");
        assert_ne!(right, csrf_token("token-b"));
        let with = |value: &str| parts(Method::POST, &[(CSRF_HEADER, value)]);
        assert!(carries_csrf(&with(&right), "token-a"));
        assert!(!carries_csrf(&with(&right), "token-b"));
        assert!(!carries_csrf(&with(""), "token-a"));
        assert!(!carries_csrf(&parts(Method::POST, &[]), "token-a"));
        assert!(is_safe(&Method::GET) && !is_safe(&Method::DELETE));
    }

    #[test]
    fn the_cookie_is_http_only_secure_and_strict() {
        let cookie = sign_in("abc.def").unwrap();
        let cookie = cookie.to_str().unwrap();
        for part in [
            "oxhorn_session=abc.def",
            "HttpOnly",
            "Secure",
            "SameSite=Strict",
        ] {
            assert!(cookie.contains(part), "{cookie}");
        }
        assert!(sign_in("abc; Path=/evil").is_none());
    }
}
