//! API calls whose work may be done already: a create that finds its object
//! there (made by a retried call, another manager, or an earlier pass the
//! cache does not show yet), a delete, patch or list that finds it gone.
//! Each caller decides what that outcome means for it.

use std::fmt::Debug;

use kube::api::PostParams;
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Creates `object`: the object as created, or `None` when one of its name
/// exists already.
pub async fn create_if_absent<K>(api: &Api<K>, object: &K) -> kube::Result<Option<K>>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(created) => Ok(Some(created)),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
        Err(error) => Err(error),
    }
}

/// `result`, with its object (or kind) not found as `None`.
pub fn unless_gone<T>(result: kube::Result<T>) -> kube::Result<Option<T>> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(code: u16) -> kube::Result<()> {
        let status = kube::core::Status::failure("the message", "Reason").with_code(code);
        Err(kube::Error::Api(status.boxed()))
    }

    #[test]
    fn only_not_found_is_gone() {
        assert_eq!(unless_gone(Ok(7)).unwrap(), Some(7));
        assert_eq!(unless_gone(failed(404)).unwrap(), None);
        assert!(unless_gone(failed(409)).is_err());
        assert!(unless_gone(failed(500)).is_err());
    }
}
