use super::llvm_major;

#[test]
fn llvm_major_from_the_toolchain_file_name() {
    assert_eq!(llvm_major("libLLVM.so.22.1-rust-1.97.0-nightly").as_deref(), Some("22"));
    assert_eq!(llvm_major("libLLVM.so.19-rust-1.90.0-nightly").as_deref(), Some("19"));
    assert_eq!(llvm_major("libLLVM-22-rust-1.97.0-nightly.so"), None);
    assert_eq!(llvm_major("libLLVM.so.x-rust"), None);
}
