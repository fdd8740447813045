//! What the front door's admission tests share: one whole exchange with the gateway on a fresh
//! connection (tokio, so that a test can hold some requests while it sends others), the
//! gateway's metrics, and the admission decisions counted there.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A chat completion request for `model` (`content` the one user message), closing its
/// connection after the answer, with its memory need in `X-Required-Memory-MB`.
pub(crate) fn chat_request(model: &str, content: &str, max_tokens: u32, stream: bool, mb: u32) -> String {
    let body = format!(
        r#"{{"model":"{model}","stream":{stream},"max_tokens":{max_tokens},"messages":[{{"role":"user","content":"{content}"}}]}}"#
    );
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nConnection: close\r\n\
         X-Required-Memory-MB: {mb}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Sends `request` to the gateway on `listen` and reads the answer until the gateway closes.
pub(crate) async fn exchange_raw(listen: &str, request: &str) -> String {
    let mut s = TcpStream::connect(listen).await.expect("connect to the gateway");
    s.write_all(request.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read the answer");
    String::from_utf8_lossy(&raw).into_owned()
}

/// The gateway's `/metrics` page, head included.
pub(crate) async fn metrics(listen: &str) -> String {
    exchange_raw(listen, "GET /metrics HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n").await
}

/// `ailb_gateway_admission_total` of `model` and `outcome` in a metrics page (0 when absent).
pub(crate) fn decisions(text: &str, model: &str, outcome: &str) -> u64 {
    let want = format!("ailb_gateway_admission_total{{model=\"{model}\",outcome=\"{outcome}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(want.as_str())?.trim().parse().ok()).unwrap_or(0)
}

/// Polls the gateway's metrics, with a deadline of 5 s, until `n` requests of `model` wait.
pub(crate) async fn wait_for_waiting(listen: &str, model: &str, n: u64) {
    let want = format!("ailb_gateway_admission_waiting{{model=\"{model}\"}} {n}");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let m = metrics(listen).await;
        if m.lines().any(|l| l.trim() == want) {
            return;
        }
        assert!(std::time::Instant::now() < until, "{n} request(s) never waited: {m}");
        tokio::task::yield_now().await;
    }
}
