use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn the_bytes_put_back_come_first_then_the_connection() {
    let (mut a, b) = tokio::io::duplex(64);
    a.write_all(b" world").await.unwrap();
    drop(a);
    let mut r = Rewind::new(Bytes::from_static(b"hello"), b);
    let mut small = [0u8; 3];
    r.read_exact(&mut small).await.unwrap();
    assert_eq!(&small, b"hel");
    let mut rest = String::new();
    r.read_to_string(&mut rest).await.unwrap();
    assert_eq!(rest, "lo world");
}
