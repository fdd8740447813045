//! The Nacos client over HTTPS (rustls) with `tls_ca_file`: against a small fake Nacos v1 server
//! (Python's http.server with ssl, `tests/integration/fixtures/tls_fake_nacos.py`) and a self-signed
//! certificate made by openssl for 127.0.0.1. rnacos serves no TLS itself.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ailb_userspace::{
    discovery::nacos::NacosSource,
    error_chain,
    nacos::{NacosApi, NacosConfig},
};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running openssl (Debian package openssl): {e}"));
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA (`ca.pem`) and a server certificate for IP 127.0.0.1 signed by it (`cert.pem`,
/// `key.pem`): rustls refuses a self-signed CA used as the server's own certificate.
fn make_cert(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=ailb test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
    );
    openssl(
        dir,
        &["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "key.pem", "-out", "srv.csr"],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext.cnf");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "srv.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "ext.cnf",
            "-out",
            "cert.pem",
        ],
    );
}

fn start(dir: &Path) -> (Server, u16) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tls_fake_nacos.py");
    let portfile = dir.join("port");
    let child = Command::new("python3")
        .arg(script)
        .arg(dir.join("cert.pem"))
        .arg(dir.join("key.pem"))
        .arg(&portfile)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("python3: {e}"));
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    let port = loop {
        if let Ok(p) = std::fs::read_to_string(&portfile) {
            break p.trim().parse::<u16>().expect("port");
        }
        assert!(Instant::now() < deadline, "the TLS fake did not start within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    (server, port)
}

fn config(port: u16, ca: Option<&Path>) -> ailb_userspace::nacos::ValidNacos {
    let mut c = NacosConfig::with_servers([format!("https://127.0.0.1:{port}")]);
    c.api = NacosApi::V1;
    c.udp_push = false;
    c.tls_ca_file = ca.map(Path::to_path_buf);
    c.validate().unwrap_or_else(|e| panic!("config: {e}"))
}

#[tokio::test]
async fn https_with_the_servers_ca_reads_and_without_it_fails_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    make_cert(dir.path());
    let (_server, port) = start(dir.path());
    let catalog = vec![("llm".to_string(), vec!["llm".to_string()])];

    let ca = dir.path().join("ca.pem");
    let mut src = NacosSource::connect(&config(port, Some(&ca)), &catalog)
        .await
        .unwrap_or_else(|e| panic!("connect: {}", error_chain(&e)));
    let snap = src.discover().await.unwrap_or_else(|e| panic!("discover over https: {}", error_chain(&e)));
    assert_eq!(snap.instances.len(), 1);
    assert_eq!(snap.instances[0].address.to_string(), "10.30.0.1:8000");

    // Without the CA the self-signed certificate is not trusted: an error, not an answer.
    let mut src = NacosSource::connect(&config(port, None), &catalog)
        .await
        .unwrap_or_else(|e| panic!("connect: {}", error_chain(&e)));
    let err = src.discover().await.expect_err("an untrusted certificate must fail");
    let text = error_chain(&err).to_lowercase();
    assert!(text.contains("certificate") || text.contains("tls") || text.contains("unknownissuer"), "{text}");
}
