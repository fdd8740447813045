//! The seam between the Nacos protocol and the network: [`Transport`] sends one request and
//! returns the status and a bounded body. [`ReqwestTransport`] is the real one (rustls);
//! unit tests use fakes.

use std::{future::Future, path::Path, time::Duration};

use reqwest::Url;

/// Largest answer body read from a server; a longer one is an error, never an allocation.
pub const MAX_BODY: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Put,
    Delete,
}

/// One HTTP request. The URL carries the query; `form` is sent url-encoded in the body.
/// Its `Debug` shows no values: the query may carry a token, the headers a token and the form
/// a password.
#[derive(Clone)]
pub struct Request {
    pub method: Method,
    pub url: Url,
    pub headers: Vec<(&'static str, String)>,
    pub form: Vec<(&'static str, String)>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = |pairs: &[(&'static str, String)]| pairs.iter().map(|(k, _)| *k).collect::<Vec<_>>();
        let mut url = self.url.clone();
        url.set_query(None);
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("url", &url.as_str())
            .field("query", &self.url.query_pairs().map(|(k, _)| k.into_owned()).collect::<Vec<_>>())
            .field("headers", &names(&self.headers))
            .field("form", &names(&self.form))
            .finish()
    }
}

/// Status and body (at most [`MAX_BODY`] bytes).
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Connecting, sending or reading failed (the URL is left out: it may carry a token).
    #[error("request failed")]
    Request(#[source] reqwest::Error),
    #[error("answer longer than {limit} bytes")]
    TooLarge { limit: usize },
    /// A transport other than reqwest (fakes) failed.
    #[error("request failed")]
    Other(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Sends one request. Implementations bound the body by [`MAX_BODY`] and time out.
pub trait Transport: Send + Sync {
    fn send(&self, req: Request) -> impl Future<Output = Result<Response, TransportError>> + Send;
}

/// reqwest with rustls: built-in web PKI roots plus an optional PEM file, one timeout for the
/// whole exchange, no redirects, no proxy from the environment.
#[derive(Debug, Clone)]
pub struct ReqwestTransport {
    client: reqwest::Client,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientBuildError {
    #[error("cannot read tls ca file {path}")]
    ReadCa {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tls ca file {path}: no usable PEM certificate")]
    ParseCa {
        path: std::path::PathBuf,
        #[source]
        source: reqwest::Error,
    },
    #[error("cannot build the http client")]
    Build(#[source] reqwest::Error),
}

impl ReqwestTransport {
    pub fn new(timeout: Duration, ca_file: Option<&Path>) -> Result<Self, ClientBuildError> {
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(concat!("ailb/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = ca_file {
            let pem = std::fs::read(path).map_err(|source| ClientBuildError::ReadCa { path: path.into(), source })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|source| ClientBuildError::ParseCa { path: path.into(), source })?;
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        Ok(Self { client: b.build().map_err(ClientBuildError::Build)? })
    }
}

impl Transport for ReqwestTransport {
    async fn send(&self, req: Request) -> Result<Response, TransportError> {
        let mut rb = match req.method {
            Method::Get => self.client.get(req.url),
            Method::Post => self.client.post(req.url),
            Method::Put => self.client.put(req.url),
            Method::Delete => self.client.delete(req.url),
        };
        for (k, v) in &req.headers {
            rb = rb.header(*k, v);
        }
        if !req.form.is_empty() {
            rb = rb.form(&req.form);
        }
        let mut resp = rb.send().await.map_err(|e| TransportError::Request(e.without_url()))?;
        let status = resp.status().as_u16();
        if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
            return Err(TransportError::TooLarge { limit: MAX_BODY });
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| TransportError::Request(e.without_url()))? {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(TransportError::TooLarge { limit: MAX_BODY });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Response { status, body })
    }
}

#[cfg(test)]
mod tests;
