//! `ModelServerSource` against a std `TcpListener` HTTP server on loopback serving exposition
//! text shaped like vLLM's and SGLang's `/metrics` (HELP/TYPE lines, labels, histograms, several
//! models). What this shows: the parse, the sums, the health rules and the error cases. The
//! bodies are written after the servers' metric names; nothing here runs a real server.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex},
    thread,
    time::Duration,
};

use ailb_userspace::telemetry::{
    model_server::{GpuMetrics, KvCapacity, MemoryUnit, ModelServerSource, ServerKind, Url, UtilUnit, MAX_BODY},
    ServerSample, TelemetryError,
};

type Route = Box<dyn Fn(&str) -> (u16, Vec<u8>) + Send>;

/// Answers each request with what the current route says for its path, then closes.
struct FakeServer {
    addr: SocketAddr,
    route: Arc<Mutex<Route>>,
}

impl FakeServer {
    fn start(route: impl Fn(&str) -> (u16, Vec<u8>) + Send + 'static) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().unwrap();
        let route: Arc<Mutex<Route>> = Arc::new(Mutex::new(Box::new(route)));
        let r = route.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let r = r.clone();
                thread::spawn(move || serve(conn, &r));
            }
        });
        FakeServer { addr, route }
    }

    fn set(&self, route: impl Fn(&str) -> (u16, Vec<u8>) + Send + 'static) {
        *self.route.lock().unwrap() = Box::new(route);
    }

    fn url(&self, path: &str) -> Url {
        Url::parse(&format!("http://{}{path}", self.addr)).unwrap()
    }
}

fn serve(conn: TcpStream, route: &Mutex<Route>) {
    let mut reader = BufReader::new(conn);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).map_or(true, |n| n == 0) || h == "\r\n" {
            break;
        }
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let (status, body) = (route.lock().unwrap())(&path);
    let mut conn = reader.into_inner();
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = conn.write_all(head.as_bytes()).and_then(|()| conn.write_all(&body));
}

fn ok(body: &str) -> (u16, Vec<u8>) {
    (200, body.as_bytes().to_vec())
}

const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="0",model_name="sql-lora"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
vllm:num_requests_waiting{engine="0",model_name="sql-lora"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.42
vllm:kv_cache_usage_perc{engine="0",model_name="sql-lora"} 0.42
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 123456.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 42.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 42.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.5
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
"#;

/// vLLM before 0.10 named the KV-cache gauge `gpu_cache_usage_perc`.
const VLLM_OLD: &str = r#"# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
"#;

const SGLANG: &str = r#"# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 4.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 0.8
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 1520.5
"#;

fn source(server: &FakeServer, health: bool, kind: ServerKind) -> ModelServerSource {
    ModelServerSource::new(server.url("/metrics"), health.then(|| server.url("/health")), kind, Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("source: {e}"))
}

fn routes(metrics: &'static str) -> impl Fn(&str) -> (u16, Vec<u8>) + Send + 'static {
    move |path| match path {
        "/metrics" => ok(metrics),
        "/health" => ok(""),
        _ => (404, b"not found".to_vec()),
    }
}

#[tokio::test]
async fn vllm_counts_are_summed_over_models() {
    let server = FakeServer::start(routes(VLLM));
    let s = source(&server, true, ServerKind::Vllm).sample().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        s,
        ServerSample {
            running: Some(5.0),
            waiting: Some(8.0),
            kv_cache_usage: Some(0.42),
            healthy: true,
            ..ServerSample::default()
        }
    );
}

#[tokio::test]
async fn vllm_before_0_10_uses_gpu_cache_usage() {
    let server = FakeServer::start(routes(VLLM_OLD));
    let s = source(&server, false, ServerKind::Vllm).sample().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        s,
        ServerSample {
            running: Some(1.0),
            waiting: Some(0.0),
            kv_cache_usage: Some(0.25),
            healthy: true,
            ..ServerSample::default()
        }
    );
}

#[tokio::test]
async fn sglang_counts() {
    let server = FakeServer::start(routes(SGLANG));
    let s = source(&server, true, ServerKind::Sglang).sample().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        s,
        ServerSample {
            running: Some(12.0),
            waiting: Some(4.0),
            kv_cache_usage: Some(0.8),
            healthy: true,
            ..ServerSample::default()
        }
    );
}

#[tokio::test]
async fn custom_names_and_absent_metrics() {
    let server =
        FakeServer::start(routes("# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 6\ntgi_queue_size 2\n"));
    let kind = ServerKind::Custom {
        running: "tgi_batch_current_size".into(),
        waiting: "tgi_queue_size".into(),
        kv_cache_usage: None,
    };
    let s = source(&server, false, kind).sample().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        s,
        ServerSample {
            running: Some(6.0),
            waiting: Some(2.0),
            kv_cache_usage: None,
            healthy: true,
            ..ServerSample::default()
        }
    );
    // vLLM names on an SGLang body: nothing known, not an error (the body is valid).
    server.set(routes(SGLANG));
    let s = source(&server, true, ServerKind::Vllm).sample().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s, ServerSample { healthy: true, ..ServerSample::default() });
}

#[tokio::test]
async fn garbage_is_an_error_never_a_panic() {
    let server = FakeServer::start(routes(VLLM));
    let src = source(&server, true, ServerKind::Vllm);
    let bodies: Vec<Vec<u8>> = vec![
        b"<html><body><h1>502 Bad Gateway</h1></body></html>\n".to_vec(),
        b"{\"running\": 3}".to_vec(),
        format!("{VLLM}vllm:num_requests_running{{model_name=\"x\"").into_bytes(),
        b"vllm:num_requests_running{model_name=\"m\"} three\n".to_vec(),
        vec![0xff, 0xfe, 0x00, 0x01, b'\n', 0x80],
    ];
    for body in bodies {
        let b = body.clone();
        server.set(move |_| (200, b.clone()));
        let e = src.sample().await.expect_err(&format!("garbage accepted: {:?}", String::from_utf8_lossy(&body)));
        assert!(matches!(e, TelemetryError::MetricsParse { .. }), "{e:?}");
        assert!(
            e.to_string().starts_with(&format!("metrics {}: not prometheus text, line ", src.metrics_url())),
            "{e}"
        );
    }
    server.set(|_| (500, b"internal error".to_vec()));
    let e = src.sample().await.expect_err("500");
    assert!(matches!(e, TelemetryError::MetricsStatus { .. }), "{e:?}");
}

#[tokio::test]
async fn an_oversized_body_is_an_error() {
    let big = format!("# {}\n", "x".repeat(MAX_BODY));
    let server = FakeServer::start(move |_| (200, big.clone().into_bytes()));
    let e = source(&server, false, ServerKind::Vllm).sample().await.expect_err("over the bound");
    assert!(matches!(e, TelemetryError::MetricsTooLarge { limit, .. } if limit == MAX_BODY), "{e:?}");
}

#[tokio::test]
async fn health_down_is_healthy_false() {
    let server = FakeServer::start(routes(VLLM));
    let src = source(&server, true, ServerKind::Vllm);
    assert!(src.sample().await.unwrap().healthy);

    // The health endpoint says 503 (vLLM while its engine is dead): load still read.
    server.set(|path| if path == "/health" { (503, vec![]) } else { ok(VLLM) });
    let s = src.sample().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(!s.healthy);
    assert_eq!(s.running, Some(5.0));
}

#[tokio::test]
async fn an_unreachable_server_is_healthy_false_not_an_error() {
    // A port nothing listens on: bind, note it, close.
    let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let url = |p: &str| Url::parse(&format!("http://{addr}{p}")).unwrap();
    for health in [None, Some(url("/health"))] {
        let src = ModelServerSource::new(url("/metrics"), health, ServerKind::Vllm, Duration::from_secs(1)).unwrap();
        let s = src.sample().await.unwrap_or_else(|e| panic!("unreachable must not be an error: {e}"));
        assert_eq!(s, ServerSample { healthy: false, ..ServerSample::default() });
    }
}

#[tokio::test]
async fn a_server_that_never_answers_is_healthy_false_within_the_timeout() {
    // Accepts and reads, never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        let mut held = Vec::new();
        for mut c in listener.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = c.read(&mut buf);
            held.push(c);
        }
    });
    let url = Url::parse(&format!("http://{addr}/metrics")).unwrap();
    let src = ModelServerSource::new(url, None, ServerKind::Vllm, Duration::from_millis(300)).unwrap();
    let started = std::time::Instant::now();
    let s = src.sample().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(!s.healthy);
    // Slow or hung, not known down: the agent's failure threshold counts it.
    assert!(s.timed_out, "{s:?}");
    // Bound: the 300 ms timeout plus scheduling slack far below the next second.
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_health_endpoint_that_never_answers_timed_out_with_the_load_read() {
    let hung = TcpListener::bind("127.0.0.1:0").unwrap();
    let health = Url::parse(&format!("http://{}/health", hung.local_addr().unwrap())).unwrap();
    thread::spawn(move || {
        let mut held = Vec::new();
        for c in hung.incoming().flatten() {
            held.push(c);
        }
    });
    let server = FakeServer::start(routes(VLLM));
    let src =
        ModelServerSource::new(server.url("/metrics"), Some(health), ServerKind::Vllm, Duration::from_millis(300))
            .unwrap();
    let s = src.sample().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(!s.healthy && s.timed_out, "{s:?}");
    assert_eq!(s.running, Some(5.0));
}

fn with_names(server: &FakeServer, names: ailb_userspace::telemetry::model_server::MetricNames) -> ModelServerSource {
    ModelServerSource::with_names(server.url("/metrics"), None, names, Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("source: {e}"))
}

/// vLLM with two data-parallel engines: its info gauge per engine, usage per engine (two
/// model-name label sets on engine 0, as with a LoRA adapter: one cache, so averaged).
const VLLM_DP: &str = r#"# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="4096"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2048"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="0",model_name="sql-lora"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:num_requests_running{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
"#;

#[tokio::test]
async fn vllm_free_kv_tokens_from_cache_config_info() {
    let server = FakeServer::start(routes(VLLM_DP));
    let mut names = ServerKind::Vllm.names();
    names.kv_capacity = KvCapacity::VllmCacheConfig;
    let src = with_names(&server, names.clone());
    let s = src.sample().await.unwrap_or_else(|e| panic!("{e}"));
    // 4096 x 16 x (1 - 0.25) + 2048 x 16 x (1 - 0.5) = 49152 + 16384.
    assert_eq!(s.kv_free_tokens, Some(65536.0), "{s:?}");
    assert!(s.unknown.is_empty(), "{s:?}");

    // One info sample without an engine label (older vLLM): it is every engine's capacity.
    server.set(routes(
        "vllm:cache_config_info{block_size=\"32\",num_gpu_blocks=\"1000\"} 1.0\nvllm:gpu_cache_usage_perc 0.1\n",
    ));
    let s = src.sample().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.kv_free_tokens, Some(32000.0 * 0.9), "{s:?}");

    // Absent or not yet initialised: unknown, with the reason.
    for (body, reason) in [
        (VLLM, "vllm:cache_config_info absent"),
        (
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1.0\nvllm:kv_cache_usage_perc 0.1\n",
            "not whole numbers",
        ),
        ("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"8\"} 1.0\n", "no KV-cache usage gauge"),
    ] {
        server.set(routes(body));
        let s = src.sample().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.kv_free_tokens, None, "{body}");
        assert!(s.unknown.len() == 1 && s.unknown[0].contains(reason), "{body}: {:?}", s.unknown);
    }
    // Without KvCapacity nothing is read and nothing is reported.
    let s = source(&server, false, ServerKind::Vllm).sample().await.unwrap();
    assert_eq!((s.kv_free_tokens, s.unknown.len()), (None, 0));
}

#[tokio::test]
async fn sglang_free_kv_tokens_from_max_total_num_tokens() {
    let body = format!(
        "{SGLANG}# TYPE sglang:max_total_num_tokens gauge\n\
         sglang:max_total_num_tokens{{model_name=\"Qwen/Qwen2.5-7B-Instruct\",tp_rank=\"0\"}} 471258.0\n\
         # TYPE sglang:num_used_tokens gauge\n\
         sglang:num_used_tokens{{tp_rank=\"0\",model_name=\"Qwen/Qwen2.5-7B-Instruct\"}} 100000.0\n"
    );
    let server = FakeServer::start(move |_| ok(&body));
    let mut names = ServerKind::Sglang.names();
    names.kv_capacity = KvCapacity::SglangTokens;
    let s = with_names(&server, names.clone()).sample().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.kv_free_tokens, Some(371258.0), "{s:?}");
    server.set(routes(SGLANG));
    let s = with_names(&server, names).sample().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.kv_free_tokens, None);
    assert!(s.unknown[0].contains("sglang:max_total_num_tokens absent"), "{:?}", s.unknown);
}

/// The DCGM exporter: one sample per GPU, `gpu` index and `UUID` labels, memory in MiB, util in %.
const DCGM: &str = r#"# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="n1"} 30000
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA A100-SXM4-80GB",Hostname="n1"} 20000
DCGM_FI_DEV_FB_FREE{gpu="2",UUID="GPU-c",device="nvidia2",modelName="NVIDIA A100-SXM4-80GB",Hostname="n1"} 80000
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="n1"} 30
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA A100-SXM4-80GB",Hostname="n1"} 60
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-c",device="nvidia2",modelName="NVIDIA A100-SXM4-80GB",Hostname="n1"} 0
"#;

/// Triton: utilisation 0..1, memory in bytes, `gpu_uuid` label.
const TRITON: &str = r#"# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-c06bbf33"} 0.250000
# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes
# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{gpu_uuid="GPU-c06bbf33"} 42949672960.000000
# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-c06bbf33"} 33763098624.000000
"#;

#[tokio::test]
async fn mapped_gpu_gauges_in_their_units() {
    let server = FakeServer::start(routes(DCGM));
    let mut names = ServerKind::Vllm.names();
    names.gpu = Some(GpuMetrics {
        memory_free: Some("DCGM_FI_DEV_FB_FREE".into()),
        memory_total: None,
        memory_used: None,
        memory_unit: MemoryUnit::MiB,
        util: Some("DCGM_FI_DEV_GPU_UTIL".into()),
        util_unit: UtilUnit::Percent,
        labels: vec![("gpu".into(), vec!["0".into(), "1".into()])],
    });
    let s = with_names(&server, names.clone()).sample().await.unwrap_or_else(|e| panic!("{e}"));
    // GPUs 0 and 1 only: 30000 + 20000 MiB, (30 + 60) / 2 %.
    assert_eq!((s.memory_free_mb, s.gpu_util_pct, s.memory_total_mb), (Some(50000.0), Some(45.0), None), "{s:?}");
    assert!(s.unknown.is_empty(), "{:?}", s.unknown);

    // A filter that matches nothing: unknown, not zero.
    let mut none = names.clone();
    none.gpu.as_mut().unwrap().labels = vec![("gpu".into(), vec!["7".into()])];
    let s = with_names(&server, none).sample().await.unwrap();
    assert_eq!((s.memory_free_mb, s.gpu_util_pct), (None, None));
    assert_eq!(s.unknown.len(), 2, "{:?}", s.unknown);
    assert!(
        s.unknown[0].contains("DCGM_FI_DEV_FB_FREE absent") && s.unknown[0].contains("gpu_labels"),
        "{:?}",
        s.unknown
    );

    // A fraction declared for a percent gauge: 3000 % is refused, not clamped.
    let mut wrong = names.clone();
    wrong.gpu.as_mut().unwrap().util_unit = UtilUnit::Fraction;
    let s = with_names(&server, wrong).sample().await.unwrap();
    assert_eq!(s.gpu_util_pct, None);
    assert!(s.unknown.iter().any(|u| u.contains("outside 0..100")), "{:?}", s.unknown);

    server.set(routes(TRITON));
    let mut triton = ServerKind::Vllm.names();
    triton.gpu = Some(GpuMetrics {
        memory_free: None,
        memory_total: Some("nv_gpu_memory_total_bytes".into()),
        memory_used: Some("nv_gpu_memory_used_bytes".into()),
        memory_unit: MemoryUnit::Bytes,
        util: Some("nv_gpu_utilization".into()),
        util_unit: UtilUnit::Fraction,
        labels: vec![],
    });
    let s = with_names(&server, triton).sample().await.unwrap_or_else(|e| panic!("{e}"));
    // (42949672960 - 33763098624) B = 8761 MiB (exactly 8761.0); 40960 MiB total; 25 %.
    assert_eq!(
        (s.memory_free_mb, s.memory_total_mb, s.gpu_util_pct),
        (Some(8761.0), Some(40960.0), Some(25.0)),
        "{s:?}"
    );
}
