use std::collections::VecDeque;
use std::net::SocketAddrV4;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;

use super::*;
use crate::config::Config;

fn responses() -> Arc<Responses> {
    let c = Config::parse("[[services]]\nmodel = \"m\"\nvip = \"127.77.0.1:8000\"\n", "t").unwrap();
    Responses::new(&c.gateway.validate(["m"]).unwrap(), Gauge::default())
}

fn stored() -> Stored {
    Stored { model: "m".into(), backend: SocketAddrV4::new([127, 0, 0, 9].into(), 80), conversation: Some("c".into()) }
}

#[tokio::test]
async fn frames_pass_unchanged_and_the_streams_id_is_learned_on_the_way() {
    let r = responses();
    let frames = [
        "event: response.created\ndata: {\"type\":\"response.cre",
        "ated\",\"response\":{\"id\":\"resp_7\"}}\n\n",
        "event: response.completed\ndata: {}\n\n",
    ];
    let inner = Frames(frames.iter().map(|f| Bytes::from_static(f.as_bytes())).collect());
    let mut body = Learn::new(inner, true, Learner { responses: r.clone(), stored: stored() });
    let mut got = Vec::new();
    while let Some(frame) = body.frame().await {
        let data = frame.unwrap().into_data().unwrap();
        got.push(String::from_utf8(data.to_vec()).unwrap());
        if got.len() == 1 {
            assert!(r.pinned("resp_7", Param::PreviousResponseId).is_err(), "not known before its event is whole");
        }
    }
    assert_eq!(got, frames, "every frame as it came");
    assert_eq!(r.pinned("resp_7", Param::PreviousResponseId).unwrap(), stored());
}

#[test]
fn an_unknown_or_gone_response_is_a_404_naming_the_id() {
    let r = responses();
    learn_whole(Learner { responses: r.clone(), stored: stored() }, br#"{"id":"resp_w","object":"response"}"#);
    assert_eq!(r.pinned("resp_w", Param::PreviousResponseId).unwrap(), stored());
    assert_eq!(r.remembered.get(), 1, "the gauge follows the table");
    let e = r.pinned("resp_nope", Param::PreviousResponseId).unwrap_err();
    assert_eq!(
        (e.status.as_u16(), e.code, e.param.as_deref()),
        (404, Some("previous_response_not_found"), Some("previous_response_id"))
    );
    assert!(e.message.contains("'resp_nope'"), "{}", e.message);
    let e = r.pinned("resp_nope", Param::ResponseId).unwrap_err();
    assert_eq!((e.code, e.param.as_deref()), (Some("response_not_found"), Some("response_id")));
    let e = gone("resp_w", stored().backend, Param::PreviousResponseId);
    assert_eq!(e.status.as_u16(), 404);
    assert!(e.message.contains("'resp_w'") && e.message.contains("127.0.0.9:80"), "{}", e.message);
}

/// A body of frames that are all there.
struct Frames(VecDeque<Bytes>);

impl HttpBody for Frames {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.get_mut().0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

#[test]
fn requests_for_one_response_by_its_id() {
    use hyper::Method;
    assert_eq!(by_id(&Method::GET, "/v1/responses/resp_1"), Some("resp_1"));
    assert_eq!(by_id(&Method::POST, "/v1/responses/resp_1/cancel"), Some("resp_1"));
    assert_eq!(by_id(&Method::POST, "/v1/responses/resp_1"), None, "POST of an id is no route");
    assert_eq!(by_id(&Method::GET, "/v1/responses/resp_1/cancel"), None);
    assert_eq!(by_id(&Method::GET, "/v1/responses/"), None);
    assert_eq!(by_id(&Method::GET, "/v1/responses/a/b"), None);
    assert_eq!(by_id(&Method::GET, "/v1/responses"), None);
}
