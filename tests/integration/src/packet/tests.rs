use super::*;

#[test]
fn a_built_frame_has_right_checksums_and_a_flipped_byte_breaks_them() {
    let f = Frame::tcp((Ipv4Addr::new(10, 0, 0, 2), 40000), (Ipv4Addr::new(10, 0, 1, 1), 80), TCP_SYN).build();
    assert!(checksums_ok(&f));
    // The RFC 1071 example: words 0001 f203 f4f5 f6f7 sum to ddf2, complemented 220d.
    assert_eq!(ones_complement(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]), 0x220d);
    let mut bad = f.clone();
    bad[ETH_HLEN + 20 + 4] ^= 1;
    assert!(!checksums_ok(&bad));
}

#[test]
fn an_ipv6_frame_has_a_right_checksum_past_its_extension_headers() {
    let a: Ipv6Addr = "fd00:a1b::2".parse().unwrap();
    let b: Ipv6Addr = "fd00:a1b:1::1".parse().unwrap();
    for ext in [vec![], vec![Ext6::HopByHop, Ext6::DestOpts], vec![Ext6::Fragment { offset: 0, more: true }]] {
        let mut fr = Frame6::tcp((a, 40000), (b, 80), TCP_SYN);
        fr.ext = ext.clone();
        fr.payload = b"abc".to_vec();
        let f = fr.build();
        assert_eq!(tcp6_checksum(&f), 0, "{ext:?}");
        assert_eq!(endpoints6(&f), ((a, 40000), (b, 80)));
        let mut bad = f.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_ne!(tcp6_checksum(&bad), 0);
        // The source address is in the pseudo-header.
        let mut moved = f.clone();
        moved[ETH_HLEN + 8] ^= 1;
        assert_ne!(tcp6_checksum(&moved), 0);
    }
}
