//! The error answers of a request ([`ApiError`]): OpenAI's shape,
//! `{"error":{"message","type","param","code"}}`, on every route but Anthropic's Messages API,
//! whose clients read Anthropic's, `{"type":"error","error":{"type","message"}}`
//! ([`ErrorShape`]).

use std::time::Duration;

use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Response, StatusCode};
use serde_json::json;

use super::{full, Body};

/// Which API's error body an answer has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ErrorShape {
    #[default]
    OpenAi,
    /// Anthropic's: its `type` names the kind by the status (`invalid_request_error`,
    /// `not_found_error`, `rate_limit_error`, `overloaded_error`, ...), there is no `param` or
    /// `code`.
    Anthropic,
}

impl ErrorShape {
    /// Anthropic's error type for `status`, as its API documents them.
    fn anthropic_type(status: StatusCode) -> &'static str {
        match status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            400..=499 => "invalid_request_error",
            _ => "api_error",
        }
    }
}

/// One error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`.
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// `Retry-After` in seconds.
    pub retry_after: Option<u32>,
    pub shape: ErrorShape,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: Some(code),
            retry_after: None,
            shape: ErrorShape::OpenAi,
        }
    }

    /// The same error in `shape`.
    pub fn shaped(mut self, shape: ErrorShape) -> Self {
        self.shape = shape;
        self
    }

    pub fn param(mut self, param: Option<&str>) -> Self {
        self.param = param.map(str::to_string);
        self
    }

    pub fn invalid_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", code, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", "not_found", message)
    }

    pub fn too_large(limit: u64) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            format!("request body: larger than the gateway's limit of {limit} bytes (gateway.max_body_bytes)"),
        )
    }

    pub fn overloaded(limit: u32) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "too_many_requests",
            format!("the gateway is serving its limit of {limit} requests at once (gateway.max_concurrent)"),
        );
        e.retry_after = Some(1);
        e
    }

    /// 429: the model's requests in flight, from every entry point, are at its running
    /// capacity (`gateway.admission`).
    pub fn at_capacity(model: &str, inflight: u64, capacity: u64, retry_after: u32) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "model_at_capacity",
            format!(
                "the model `{model}` is at its capacity: {inflight} requests in flight, capacity {capacity} \
                 (the sum of its backends' max_inflight)"
            ),
        );
        e.retry_after = Some(retry_after);
        e
    }

    /// 503: the model's memory in flight stayed above its limit for the whole admission wait
    /// (`gateway.admission`, mode "fleet_memory").
    pub fn model_overloaded(model: &str, inflight_mb: u64, limit_mb: u64, waited: Duration, retry_after: u32) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "model_overloaded",
            format!(
                "the model `{model}` is overloaded: {inflight_mb} MB of requests in flight against a limit of \
                 {limit_mb} MB (its backends' KV capacity x gateway.admission.factor), no room within {waited:?} \
                 (gateway.admission.max_wait)"
            ),
        );
        e.retry_after = Some(retry_after);
        e
    }

    /// 503: every backend of the model stayed at its `max_inflight` for the whole admission
    /// wait (a connect would be refused).
    pub fn model_at_caps(model: &str, waited: Duration, retry_after: u32) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "model_overloaded",
            format!(
                "the model `{model}` is overloaded: every backend is at its max_inflight, no slot within {waited:?} \
                 (gateway.admission.max_wait)"
            ),
        );
        e.retry_after = Some(retry_after);
        e
    }

    /// 429: `max_queued` requests of the model already wait for admission.
    pub fn admission_queue_full(model: &str, max_queued: u32, retry_after: u32) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "admission_queue_full",
            format!(
                "the model `{model}` has {max_queued} requests waiting for admission already \
                 (gateway.admission.max_queued)"
            ),
        );
        e.retry_after = Some(retry_after);
        e
    }

    /// The code of [`ApiError::unavailable`].
    pub const NO_BACKEND: &'static str = "no_backend";

    /// 503: the connect was refused (no live backend of the model fits the request, or the
    /// address refuses connections).
    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", Self::NO_BACKEND, message);
        e.retry_after = Some(1);
        e
    }

    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, "server_error", "upstream_error", message)
    }

    /// 408: the client was too slow to send its request.
    pub fn client_timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, "invalid_request_error", "request_timeout", message)
    }

    /// 408: a request body slower than `within` (`gateway.header_timeout`).
    pub fn body_timeout(within: Duration) -> Self {
        Self::client_timeout(format!("the request body did not arrive within {within:?} (gateway.header_timeout)"))
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::GATEWAY_TIMEOUT, "server_error", "upstream_timeout", message)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        match self.shape {
            ErrorShape::OpenAi => {
                json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
            }
            ErrorShape::Anthropic => json!({
                "type": "error",
                "error": {"type": ErrorShape::anthropic_type(self.status), "message": self.message},
            }),
        }
    }

    /// The error as the last event of a broken-off event stream: `data:` with the body, and for
    /// Anthropic's clients the `event: error` line they dispatch on.
    pub fn event(&self) -> String {
        match self.shape {
            ErrorShape::OpenAi => format!("data: {}\n\n", self.body()),
            ErrorShape::Anthropic => format!("event: error\ndata: {}\n\n", self.body()),
        }
    }

    pub fn into_response(self) -> Response<Body> {
        let mut resp = Response::new(full(self.body().to_string()));
        *resp.status_mut() = self.status;
        resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(s) = self.retry_after {
            resp.headers_mut().insert(RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}
