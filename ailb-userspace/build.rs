//! Embeds the eBPF object built by `cargo xtask build` (at `<workspace>/target/bpf/ailb.bpf.o`).
//! Without it an empty object is embedded and `ailb run` says how to build it, so that
//! `cargo check`, clippy and unit tests work without the nightly eBPF toolchain.
use std::{env, fs, path::PathBuf};

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let object = manifest.join("../target/bpf/ailb.bpf.o");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("ailb.bpf.o");
    println!("cargo:rerun-if-changed={}", object.display());
    match fs::read(&object) {
        Ok(bytes) => fs::write(&out, bytes).expect("write embedded eBPF object"),
        Err(_) => fs::write(&out, []).expect("write empty eBPF object"),
    }
}
