use std::sync::{Arc, RwLock};

use super::*;
use crate::config::Config;
use crate::daemon::http;
use crate::discovery::from_static;
use crate::policy;

/// The plan the daemon makes of a catalog with one model and one static backend.
fn view() -> PlanView {
    let text = "[[services]]\nmodel = \"m\"\nvip = \"127.77.0.1:8000\"\n\
                [[backends]]\nmodel = \"m\"\naddress = \"10.1.0.1:80\"\nweight = 1\nmax_inflight = 16\n";
    let cfg = Config::parse(text, "test").and_then(|c| c.validate()).unwrap();
    let models = policy::plan(&from_static(&cfg.backends), &cfg.models, &cfg.policy, &mut Default::default());
    PlanView { generation: 3, models }
}

/// What the daemon's endpoint serves reads back whole, before its first plan and after.
#[tokio::test]
async fn the_client_reads_what_the_daemons_endpoint_serves() {
    let shared = Arc::new(http::Shared { registry: Default::default(), plan: RwLock::new(None) });
    let addr = http::serve("127.0.0.1:0".parse().unwrap(), shared.clone()).await.unwrap();
    let client = PlanClient::new(addr);
    assert_eq!(client.url(), format!("http://{addr}/v1/plan"));
    assert_eq!(client.fetch().await.unwrap(), None, "before the first plan");
    assert!(matches!(client.latest().await, Err(PlanError::NoPlan { .. })));
    *shared.plan.write().unwrap() = Some(view());
    assert_eq!(client.latest().await.unwrap(), view());
    assert_eq!(parse(&serde_json::to_string(&Some(view())).unwrap()).unwrap(), Some(view()));
}

/// A daemon that does not listen is an error naming the address, not a hang.
#[tokio::test]
async fn no_daemon_is_an_error_that_names_the_url() {
    let addr = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let err = PlanClient::new(addr).latest().await.unwrap_err();
    assert!(matches!(err, PlanError::Request { .. }), "{err:?}");
    assert!(err.to_string().contains(&format!("http://{addr}/v1/plan")), "{err}");
}
