use super::*;

#[test]
fn static_refuses_a_switch_to_nacos_by_name() {
    let cfg = crate::config::load_valid(None).unwrap();
    let mut src = StaticSource::new(&cfg.discovery()).unwrap();
    let mut nacos = cfg.discovery();
    let n = crate::nacos::NacosConfig::with_servers(["http://127.0.0.1:1"]).validate().unwrap();
    nacos.source = ValidSource::Nacos(Box::new(n));
    let e = src.reconfigure(&nacos).unwrap_err();
    assert!(matches!(e, SourceError::SwitchSource { from: "static", to: "nacos" }), "{e}");
    assert!(src.reconfigure(&cfg.discovery()).is_ok());
}
