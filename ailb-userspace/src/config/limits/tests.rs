use super::*;

#[test]
fn defaults_fit_1024_small_models_or_one_of_16384_backends() {
    let d = LimitsConfig::default();
    assert!(d.validate(&[16; 1024]).is_ok());
    assert!(d.validate(&[16384]).is_ok());
}

#[test]
fn bad_sizes_and_a_catalog_that_does_not_fit_name_the_field_and_value() {
    let l = |table_slots, member_slots| LimitsConfig {
        table_slots,
        member_slots,
        prefix_entries: ailb_common::DEFAULT_PREFIX_ENTRIES,
    };
    let e = l(1000, 64).validate(&[1]).unwrap_err().to_string();
    assert!(e.contains("limits.table_slots") && e.contains("1000") && e.contains("multiple of 1024"), "{e}");
    let e = l(8192, 24).validate(&[1]).unwrap_err().to_string();
    assert!(e.contains("limits.member_slots") && e.contains("24"), "{e}");
    // Two small models need 2 x 1,024 slots, and 1,024 more to swap one of them.
    let e = l(2048, 64).validate(&[1, 3]).unwrap_err().to_string();
    assert!(e.contains("limits.table_slots") && e.contains("2048") && e.contains("at least 3072"), "{e}");
    assert!(l(3072, 64).validate(&[1, 3]).is_ok());
    // One of 11 backends takes two chunks (2,039 slots), and two more to swap it.
    let e = l(3072, 64).validate(&[1, 11]).unwrap_err().to_string();
    assert!(e.contains("at least 5120"), "{e}");
    let e = l(12288, 32).validate(&[1, 17]).unwrap_err().to_string();
    assert!(e.contains("limits.member_slots") && e.contains("at least 80"), "{e}");
}
