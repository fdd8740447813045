use super::*;
use core::mem::{offset_of, size_of};

#[test]
fn layouts_have_no_implicit_padding() {
    assert_eq!(size_of::<FlowKey>(), 16);
    assert_eq!(offset_of!(Flow, last_seen_ns), 32);
    assert_eq!(offset_of!(Flow, peer), 40);
    assert_eq!(size_of::<Flow>(), 56);
    assert_eq!(size_of::<TcConfig>(), 24);
    assert_eq!(size_of::<TcConfig6>(), 16);
    assert_eq!(size_of::<FlowKey6>(), 40);
    assert_eq!(offset_of!(Flow6, last_seen_ns), 56);
    assert_eq!(offset_of!(Flow6, peer), 64);
    assert_eq!(size_of::<Flow6>(), 104);
    assert_eq!(size_of::<Flow6>(), 16 * 2 + 2 * 2 + 4 * 5 + 8 + 40);
    assert_eq!(size_of::<TcModel>(), 8);
    assert_eq!(size_of::<TcStats>(), 11 * 8);
    // Field sums equal the sizes: no byte the compiler added.
    assert_eq!(size_of::<Flow>(), 4 * 2 + 2 * 2 + 4 * 5 + 8 + 16);
    assert_eq!(size_of::<TcConfig>(), 4 * 2 + 2 * 2 + 4 + 8);
}

#[test]
fn each_fin_flag_is_the_low_bit_of_a_byte_of_its_own() {
    let mut flags = 0u32;
    // As the datapath notes them: each side stores 1 into its own byte, in either order.
    for fin in [FLOW_FIN_BACKEND, FLOW_FIN_CLIENT] {
        let mut bytes = flags.to_le_bytes();
        bytes[flow_fin_byte(fin)] = 1;
        flags = u32::from_le_bytes(bytes);
        assert_ne!(flags & fin, 0, "{fin:#x} set by its byte");
    }
    assert_eq!(flags, FLOW_FIN_CLIENT | FLOW_FIN_BACKEND);
    assert_ne!(flow_fin_byte(FLOW_FIN_CLIENT), flow_fin_byte(FLOW_FIN_BACKEND));
    assert!(flow_fin_byte(FLOW_FIN_BACKEND) < 4);
}
