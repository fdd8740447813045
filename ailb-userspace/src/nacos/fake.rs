//! A fake [`Transport`] for unit tests: answers with a handler and records every request.

use std::sync::{Arc, Mutex};

use super::http::{Request, Response, Transport, TransportError};

type Handler = dyn Fn(&Request) -> Result<Response, TransportError> + Send + Sync;

/// Answers with `handler` and records every request.
#[derive(Clone)]
pub(crate) struct Fake {
    handler: Arc<Handler>,
    seen: Arc<Mutex<Vec<Request>>>,
}

impl Fake {
    pub(crate) fn new(h: impl Fn(&Request) -> Result<Response, TransportError> + Send + Sync + 'static) -> Self {
        Self { handler: Arc::new(h), seen: Arc::default() }
    }
    /// `host/path` of every request so far.
    pub(crate) fn paths(&self) -> Vec<String> {
        self.seen.lock().unwrap().iter().map(|r| format!("{}{}", r.url.host_str().unwrap(), r.url.path())).collect()
    }
    pub(crate) fn last(&self) -> Request {
        self.seen.lock().unwrap().last().cloned().unwrap()
    }
}

impl Transport for Fake {
    async fn send(&self, req: Request) -> Result<Response, TransportError> {
        self.seen.lock().unwrap().push(req.clone());
        (self.handler)(&req)
    }
}

pub(crate) fn ok(v: serde_json::Value) -> Result<Response, TransportError> {
    Ok(Response { status: 200, body: v.to_string().into_bytes() })
}
pub(crate) fn status(s: u16, body: &str) -> Result<Response, TransportError> {
    Ok(Response { status: s, body: body.as_bytes().to_vec() })
}
pub(crate) fn unreachable() -> Result<Response, TransportError> {
    Err(TransportError::Other("connection refused".into()))
}
pub(crate) fn query(r: &Request, k: &str) -> Option<String> {
    r.url.query_pairs().find(|(n, _)| n == k).map(|(_, v)| v.into_owned())
}
