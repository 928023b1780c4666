//! Each project's share of the server's connections and streams (`[limits]`
//! `max_connections_per_project`, `max_log_streams_per_project`,
//! `max_storage_streams_per_project`), so that one tenant at its limits leaves the others
//! what the server has.
//!
//! - A **connection** belongs to the project of its last request (the project of the path,
//!   or, for paths without one such as storage's, the projects of its token). A project
//!   that holds its share of connections is answered 429 on a new one, and that connection
//!   is closed (`Connection: close`): a tenant cannot keep more open by re-using them.
//! - A **log stream** (`logs?follow=true`) holds one of its project's streams until it ends.
//! - A **storage stream** (an upload or download of an object) holds one of its project's
//!   streams while its bytes move; the server-wide bound ([`crate::storage::MAX_TRANSFERS`])
//!   is taken after it, so that one project's streams never take all of those.
//!
//! Administrators' (`"*"`) tokens and requests that name no project are not counted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use trainyard_api::ApiError;

/// What a project holds a share of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Share {
    Connections,
    LogStreams,
    StorageStreams,
}

impl Share {
    /// The config key that bounds it.
    pub fn key(self) -> &'static str {
        match self {
            Share::Connections => "limits.max_connections_per_project",
            Share::LogStreams => "limits.max_log_streams_per_project",
            Share::StorageStreams => "limits.max_storage_streams_per_project",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Share::Connections => "connections",
            Share::LogStreams => "followed log streams",
            Share::StorageStreams => "object uploads and downloads",
        }
    }
}

/// The projects' held shares.
#[derive(Debug)]
pub struct Shares {
    connections: usize,
    log_streams: usize,
    storage_streams: usize,
    held: Mutex<HashMap<(Share, String), usize>>,
}

/// A share held until dropped.
#[derive(Debug)]
pub struct Held {
    shares: Arc<Shares>,
    share: Share,
    project: String,
}

impl Held {
    pub fn project(&self) -> &str {
        &self.project
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock().unwrap_or_else(|p| p.into_inner());
        let k = (self.share, std::mem::take(&mut self.project));
        if let Some(n) = held.get_mut(&k) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&k);
            }
        }
    }
}

/// A project over one of its shares: 429 RESOURCE_EXHAUSTED naming the key.
#[derive(Debug, Clone, PartialEq)]
pub struct OverShare {
    pub share: Share,
    pub project: String,
    pub limit: usize,
}

impl OverShare {
    pub fn message(&self) -> String {
        format!(
            "Project \"{}\" has {} {} open, its share of the server ({}); close one, or try again once one ends.",
            self.project,
            self.limit,
            self.share.what(),
            self.share.key()
        )
    }

    pub fn api_error(&self) -> ApiError {
        ApiError::resource_exhausted(self.message())
    }

    /// The API's 429; for a connection, one that closes it.
    pub fn response(&self) -> Response {
        let mut resp = crate::reply::AppError(self.api_error()).into_response();
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        if self.share == Share::Connections {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

impl Shares {
    /// The shares of `[limits]`: `max_connections_per_project`,
    /// `max_log_streams_per_project`, `max_storage_streams_per_project`.
    pub fn new(connections: usize, log_streams: usize, storage_streams: usize) -> Arc<Shares> {
        Arc::new(Shares { connections, log_streams, storage_streams, held: Mutex::new(HashMap::new()) })
    }

    fn limit(&self, share: Share) -> usize {
        match share {
            Share::Connections => self.connections,
            Share::LogStreams => self.log_streams,
            Share::StorageStreams => self.storage_streams,
        }
    }

    /// Take one of `project`'s `share`, or say which limit it is at.
    pub fn take(self: &Arc<Self>, share: Share, project: &str) -> Result<Held, OverShare> {
        let limit = self.limit(share);
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        // A refusal leaves nothing behind (no entry of 0 for each name refused).
        if held.get(&(share, project.to_string())).copied().unwrap_or(0) >= limit {
            return Err(OverShare {
                share,
                project: project.to_string(),
                limit,
            });
        }
        *held.entry((share, project.to_string())).or_insert(0) += 1;
        Ok(Held {
            shares: Arc::clone(self),
            share,
            project: project.to_string(),
        })
    }

    /// How many of `share` `project` holds now.
    pub fn held(&self, share: Share, project: &str) -> usize {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(&(share, project.to_string()))
            .copied()
            .unwrap_or(0)
    }
}

/// The project a connection is counted for, kept by the listener for the connection's
/// life and put in each of its requests' extensions.
#[derive(Debug, Default)]
pub struct ConnectionShare(Mutex<Option<Held>>);

impl ConnectionShare {
    /// Count the connection for `project` (already counted for it: nothing to do; counted
    /// for another: that one is given back first).
    pub fn claim(&self, shares: &Arc<Shares>, project: &str) -> Result<(), OverShare> {
        let mut mine = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if mine.as_ref().is_some_and(|h| h.project() == project) {
            return Ok(());
        }
        *mine = None;
        *mine = Some(shares.take(Share::Connections, project)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(c: usize, l: usize, s: usize) -> Arc<Shares> {
        Shares::new(c, l, s)
    }

    #[test]
    fn a_project_at_its_share_is_refused_with_the_key_and_others_are_not() {
        let s = shares(8, 2, 1);
        let a1 = s.take(Share::LogStreams, "evil").expect("first");
        let _a2 = s.take(Share::LogStreams, "evil").expect("second");
        let over = s.take(Share::LogStreams, "evil").unwrap_err();
        assert_eq!(over.limit, 2);
        assert!(
            over.message()
                .contains("limits.max_log_streams_per_project"),
            "{}",
            over.message()
        );
        assert!(over.message().contains("\"evil\""), "{}", over.message());
        assert_eq!(
            over.api_error().code,
            trainyard_api::Code::ResourceExhausted
        );
        assert!(
            s.take(Share::LogStreams, "victim").is_ok(),
            "another project has its own share"
        );
        assert!(
            s.take(Share::StorageStreams, "evil").is_ok(),
            "another kind of share is counted apart"
        );
        drop(a1);
        assert_eq!(s.held(Share::LogStreams, "evil"), 1);
        assert!(
            s.take(Share::LogStreams, "evil").is_ok(),
            "a stream that ended gives its share back"
        );
    }

    #[test]
    fn a_connection_is_counted_once_for_the_project_of_its_last_request() {
        let s = shares(2, 1, 1);
        let (c1, c2, c3) = (
            ConnectionShare::default(),
            ConnectionShare::default(),
            ConnectionShare::default(),
        );
        c1.claim(&s, "evil").expect("c1");
        c1.claim(&s, "evil").expect("c1 again: the same connection");
        c2.claim(&s, "evil").expect("c2");
        assert_eq!(s.held(Share::Connections, "evil"), 2);
        let over = c3.claim(&s, "evil").unwrap_err();
        assert!(over
            .message()
            .contains("limits.max_connections_per_project"));
        assert_eq!(
            over.response()
                .headers()
                .get(header::CONNECTION)
                .map(|v| v.as_bytes()),
            Some(&b"close"[..])
        );
        c3.claim(&s, "victim").expect("another project");
        // c1 moves to the victim: evil's count goes down, the victim's up.
        c1.claim(&s, "victim").expect("c1 to victim");
        assert_eq!(
            (
                s.held(Share::Connections, "evil"),
                s.held(Share::Connections, "victim")
            ),
            (1, 2)
        );
        c3.claim(&s, "evil").expect("evil has room again");
        drop(c2);
        assert_eq!(
            s.held(Share::Connections, "evil"),
            1,
            "a closed connection gives its share back"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

        /// Fuzz of the shares: any sequence of takes, drops and connection claims by three
        /// projects agrees with a model (a take succeeds exactly while the project holds
        /// fewer than its limit; an over-share names its limit), and once everything is
        /// dropped nothing is held.
        #[test]
        fn shares_agree_with_a_model_whatever_the_order(
            ops in proptest::collection::vec((0u8..4, 0usize..3, 0usize..3, 0usize..8), 1..200),
            limits in (0usize..4, 0usize..4, 0usize..4),
        ) {
            let s = Shares::new(limits.0, limits.1, limits.2);
            let kinds = [Share::Connections, Share::LogStreams, Share::StorageStreams];
            let projects = ["evil", "victim", "other"];
            let mut held: Vec<Held> = Vec::new();
            let conns: Vec<ConnectionShare> = (0..4).map(|_| ConnectionShare::default()).collect();
            for (op, k, p, i) in ops {
                let (share, project) = (kinds[k], projects[p]);
                match op {
                    0 | 1 => {
                        let before = s.held(share, project);
                        match s.take(share, project) {
                            Ok(h) => {
                                proptest::prop_assert!(before < s.limit(share));
                                held.push(h);
                            }
                            Err(over) => {
                                proptest::prop_assert_eq!(before, s.limit(share));
                                proptest::prop_assert_eq!(over.limit, s.limit(share));
                                proptest::prop_assert!(over.message().contains(share.key()));
                            }
                        }
                    }
                    2 => {
                        if !held.is_empty() {
                            held.swap_remove(i % held.len());
                        }
                    }
                    _ => {
                        let _ = conns[i % conns.len()].claim(&s, project);
                    }
                }
                for share in kinds {
                    for project in projects {
                        let mine = held.iter().filter(|h| h.share == share && h.project == project).count();
                        let by_conns = conns
                            .iter()
                            .filter(|c| share == Share::Connections && c.0.lock().unwrap().as_ref().is_some_and(|h| h.project() == project))
                            .count();
                        proptest::prop_assert_eq!(s.held(share, project), mine + by_conns);
                        proptest::prop_assert!(s.held(share, project) <= s.limit(share));
                    }
                }
            }
            drop(held);
            drop(conns);
            proptest::prop_assert!(s.held.lock().unwrap().is_empty());
        }
    }
}
