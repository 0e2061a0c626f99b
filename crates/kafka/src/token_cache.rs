//! The current OAUTHBEARER token of one set of settings, shared by every connection made from
//! them (`crate::oauth` fills and renews it). It sits in the settings, so it is kept here,
//! apart from the code that fetches tokens: settings stay plain data.

use crate::Secret;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A token and when to renew it.
#[derive(Clone)]
pub(crate) struct Held {
    pub(crate) value: Secret,
    pub(crate) renew_at: Instant,
    /// When the token expires (ms since the epoch).
    pub(crate) expires_ms: i64,
}

/// The current token of one set of OAUTHBEARER settings. Clones share it; it is not part of
/// the configuration (equal whatever it holds).
#[derive(Clone, Default)]
pub struct TokenCache(Arc<Shared>);

#[derive(Default)]
struct Shared {
    /// Held briefly, never across a request.
    held: std::sync::Mutex<Option<Held>>,
    /// One renewal at a time: an identity provider that is slow or retrying keeps only the
    /// connections that have no usable token waiting.
    renewal: tokio::sync::Mutex<()>,
}

impl PartialEq for TokenCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for TokenCache {}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenCache")
    }
}

impl TokenCache {
    /// One renewal at a time (see [`Shared`]).
    pub(crate) fn renewal(&self) -> &tokio::sync::Mutex<()> {
        &self.0.renewal
    }

    pub(crate) fn held(&self) -> std::sync::MutexGuard<'_, Option<Held>> {
        self.0.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The token held, if it is not yet due for renewal (nor expired: after a failed renewal,
    /// the next try may be due after the expiry).
    pub(crate) fn fresh(&self) -> Option<Secret> {
        let held = self.held();
        let h = held.as_ref()?;
        (Instant::now() < h.renew_at && now_ms() < h.expires_ms).then(|| h.value.clone())
    }

    /// The token held, if it has not expired (it may be due for renewal).
    pub(crate) fn unexpired(&self) -> Option<Secret> {
        let held = self.held();
        let h = held.as_ref()?;
        (now_ms() < h.expires_ms).then(|| h.value.clone())
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
