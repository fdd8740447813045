//! Login against rnacos 0.8.8 with Open API auth on (`RNACOS_ENABLE_OPEN_API_AUTH=true`, users
//! from `RNACOS_INIT_ADMIN_USERNAME`/`PASSWORD`). rnacos serves both `/nacos/v3/auth/user/login`
//! and `/nacos/v1/auth/login`, refuses a wrong password with 403 `unknown user!`, and checks
//! the `accessToken` header or query parameter on every `/nacos/*` request.

use ailb_tests::nacos::{NacosInstance, RnacosServer};
use ailb_userspace::{
    discovery::nacos::NacosSource,
    error_chain,
    nacos::{NacosConfig, NacosError, Secret, ValidNacos},
};

const AUTH: &[(&str, &str)] = &[
    ("RNACOS_ENABLE_OPEN_API_AUTH", "true"),
    ("RNACOS_INIT_ADMIN_USERNAME", "ailb"),
    ("RNACOS_INIT_ADMIN_PASSWORD", "s3cret-pw"),
];

fn config(url: String, creds: Option<(&str, &str)>) -> ValidNacos {
    let mut c = NacosConfig::with_servers([url]);
    if let Some((u, p)) = creds {
        c.username = Some(u.into());
        c.password = Some(Secret::new(p));
    }
    c.validate().unwrap_or_else(|e| panic!("test config: {e}"))
}

fn catalog() -> Vec<(String, Vec<String>)> {
    vec![("llm".to_string(), vec!["llm".to_string()])]
}

#[tokio::test]
async fn login_with_the_right_password_reads_instances() {
    let nacos = RnacosServer::start_with(AUTH);
    nacos.register(&NacosInstance::new("llm", "10.20.0.1", 8000));
    let mut src = NacosSource::connect(&config(nacos.url(), Some(("ailb", "s3cret-pw"))), &catalog())
        .await
        .unwrap_or_else(|e| panic!("connect: {}", error_chain(&e)));
    let snap = src.discover().await.unwrap_or_else(|e| panic!("discover: {}", error_chain(&e)));
    assert_eq!(snap.instances.len(), 1);
    assert_eq!(snap.instances[0].address.to_string(), "10.20.0.1:8000");
}

#[tokio::test]
async fn a_wrong_password_is_a_clear_start_up_error() {
    let nacos = RnacosServer::start_with(AUTH);
    let e = NacosSource::connect(&config(nacos.url(), Some(("ailb", "wrong"))), &catalog())
        .await
        .err()
        .expect("connect with a wrong password must fail");
    let msg = e.to_string();
    assert!(matches!(e, NacosError::LoginRefused { status: 403, .. }), "{msg}");
    assert!(msg.contains(&nacos.url()), "names the server: {msg}");
    assert!(msg.contains("\"ailb\"") && msg.contains("unknown user!"), "names the user and the server's reason: {msg}");
    assert!(!msg.contains("wrong"), "never prints the password: {msg}");
}

#[tokio::test]
async fn without_credentials_reads_are_refused() {
    let nacos = RnacosServer::start_with(AUTH);
    let mut src = NacosSource::connect(&config(nacos.url(), None), &catalog()).await.expect("no login, no error");
    let e = src.discover().await.expect_err("auth is on");
    assert!(matches!(e, NacosError::Status { status: 403, .. }), "{}", error_chain(&e));
}

#[tokio::test]
async fn with_auth_off_any_credentials_are_accepted() {
    // rnacos with auth off answers every login with a placeholder token (AUTH_DISABLED).
    let nacos = RnacosServer::start();
    nacos.register(&NacosInstance::new("llm", "10.21.0.1", 8000));
    let mut src = NacosSource::connect(&config(nacos.url(), Some(("anyone", "anything"))), &catalog())
        .await
        .unwrap_or_else(|e| panic!("connect: {}", error_chain(&e)));
    assert_eq!(src.discover().await.unwrap_or_else(|e| panic!("{}", error_chain(&e))).instances.len(), 1);
}
