//! The argument mapping and the HELLO negotiation, then the agent on a real socket (port 0)
//! with hand-written frames, as HAProxy sends them.

use std::net::Ipv4Addr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::frame::{self, Typed};
use super::*;
use crate::clock::{ManualClock, Timestamp};
use crate::config::{ConfigHandle, LoadOptions, parse_files};
use crate::service::ServiceOptions;
use crate::store::MemoryStore;

fn entries(r: &Request) -> Vec<Vec<(&str, &str)>> {
    r.entry_pairs()
}

#[test]
fn arguments_make_descriptors_in_index_order_and_null_drops_one() {
    let args: Vec<(&[u8], Typed<'_>)> = vec![
        (b"1.api_key", Typed::String(b"k1")),
        (b"domain", Typed::String(b"edge")),
        (b"0.remote_address", Typed::Ipv4(Ipv4Addr::new(10, 0, 0, 1))),
        (b"1.route", Typed::String(b"/a")),
        (b"2.user", Typed::Null),
        (b"2.other", Typed::String(b"x")),
        (b"3.n", Typed::Int64(-3)),
        (b"hits_addend", Typed::Uint32(2)),
    ];
    let r = request_from_args(&args).unwrap();
    assert_eq!(r.domain, "edge");
    assert_eq!(r.hits_addend, 2);
    assert_eq!(
        entries(&r),
        vec![
            vec![("remote_address", "10.0.0.1")],
            vec![("api_key", "k1"), ("route", "/a")],
            vec![("n", "-3")],
        ]
    );
}

#[test]
fn bad_arguments_are_reasons() {
    let e = |args: &[(&[u8], Typed<'_>)]| request_from_args(args).unwrap_err().to_string();
    assert_eq!(
        e(&[(b"0.k", Typed::String(b"v"))]),
        "no domain argument (a non-empty string)"
    );
    assert!(e(&[(b"domain", Typed::String(b"d")), (b"x", Typed::Null)]).contains("\"x\" is not"));
    assert!(e(&[(b"domain", Typed::String(b"d")), (b"0.", Typed::Null)]).contains("is not"));
    assert!(
        e(&[
            (b"domain", Typed::String(b"d")),
            (b"hits_addend", Typed::Int32(-1))
        ])
        .contains("hits_addend")
    );
}

fn hello_frame(items: &[(&str, Typed<'_>)]) -> Vec<u8> {
    frame::encode(frame::HAPROXY_HELLO, 0, 0, &frame::kv_payload(items))
}

#[test]
fn hello_negotiates_version_and_frame_size() {
    let ok = [
        ("supported-versions", Typed::String(b"2.0")),
        ("max-frame-size", Typed::Uint32(16_380)),
        ("capabilities", Typed::String(b"pipelining")),
    ];
    let bytes = hello_frame(&ok);
    let f = Frame::parse(&bytes[4..]).unwrap();
    assert_eq!(negotiate(&f, 4096).unwrap(), (4096, false));
    assert_eq!(negotiate(&f, 65_536).unwrap(), (16_380, false));
    let status = |items: &[(&str, Typed<'_>)]| {
        let bytes = hello_frame(items);
        negotiate(&Frame::parse(&bytes[4..]).unwrap(), 4096)
            .unwrap_err()
            .status
    };
    assert_eq!(status(&ok[1..]), Status::NoVersion);
    assert_eq!(
        status(&[
            ("supported-versions", Typed::String(b"1.0")),
            ok[1].clone(),
            ok[2].clone()
        ]),
        Status::BadVersion
    );
    assert_eq!(status(&[ok[0].clone(), ok[2].clone()]), Status::NoFrameSize);
    assert_eq!(
        status(&[
            ok[0].clone(),
            ("max-frame-size", Typed::Uint32(100)),
            ok[2].clone()
        ]),
        Status::BadFrameSize
    );
    assert_eq!(status(&ok[..2]), Status::NoCapabilities);
}

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 2}
"#;

/// The agent on 127.0.0.1:0 over a memory store at 2 s into a minute; its port.
async fn agent(max_frame_bytes: u32) -> u16 {
    agent_with(max_frame_bytes, 64 * 1024).await
}

/// [`agent`] with a byte budget of `budget` for frames being read.
async fn agent_with(max_frame_bytes: u32, budget: usize) -> u16 {
    agent_until(max_frame_bytes, budget, std::future::pending()).await
}

/// [`agent_with`], serving until `stop`.
async fn agent_until(
    max_frame_bytes: u32,
    budget: usize,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> u16 {
    let cfg = parse_files(
        &[("edge.yaml".to_string(), CONFIG.to_string())],
        &LoadOptions::default(),
    )
    .expect("test config loads");
    let service = Arc::new(RateLimitService::new(
        ConfigHandle::new(Some(cfg)),
        Arc::new(MemoryStore::new(1000)),
        Arc::new(ManualClock::new(Timestamp::from_secs(2222))),
        ServiceOptions::default(),
    ));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let options = SpoaOptions { max_frame_bytes };
    let budget = ByteBudget::new(budget);
    tokio::spawn(serve(
        listener,
        service,
        (options, Limits::default(), budget),
        stop,
    ));
    port
}

async fn read_frame(s: &mut TcpStream) -> Vec<u8> {
    let mut len = [0; 4];
    s.read_exact(&mut len).await.unwrap();
    let mut body = vec![0; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).await.unwrap();
    body
}

async fn connect(port: u16, max_frame: u32) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let hello = hello_frame(&[
        ("supported-versions", Typed::String(b"2.0")),
        ("max-frame-size", Typed::Uint32(max_frame)),
        ("capabilities", Typed::String(b"pipelining")),
        ("engine-id", Typed::String(b"test")),
    ]);
    s.write_all(&hello).await.unwrap();
    let reply = read_frame(&mut s).await;
    (s, reply)
}

fn notify(frame_id: u64, args: &[(&str, Typed<'_>)]) -> Vec<u8> {
    let mut payload = Vec::new();
    frame::put_varint(&mut payload, 5);
    payload.extend_from_slice(b"check");
    payload.push(args.len() as u8);
    payload.extend_from_slice(&frame::kv_payload(args));
    frame::encode(frame::NOTIFY, 1, frame_id, &payload)
}

/// The `set-var` actions of an ACK, as name -> value.
fn vars(ack: &[u8]) -> Vec<(String, Typed<'static>)> {
    let f = Frame::parse(ack).unwrap();
    assert_eq!(f.kind, frame::ACK);
    let mut r = frame::Reader::new(f.payload);
    let mut out = Vec::new();
    while !r.is_empty() {
        assert_eq!(r.byte("action").unwrap(), 1, "set-var");
        assert_eq!(r.byte("nb-args").unwrap(), 3);
        assert_eq!(r.byte("scope").unwrap(), frame::SCOPE_TRANSACTION);
        let name = String::from_utf8(r.bytes("name").unwrap().to_vec()).unwrap();
        let value = match r.typed().unwrap() {
            Typed::String(s) => Typed::String(s.to_vec().leak()),
            other => other.clone_static(),
        };
        out.push((name, value));
    }
    out
}

#[tokio::test]
async fn an_agent_answers_hello_and_notify_frames_with_variables() {
    let port = agent(4096).await;
    let (mut s, reply) = connect(port, 16_380).await;
    let hello = Frame::parse(&reply).unwrap();
    assert_eq!(hello.kind, frame::AGENT_HELLO);
    let kv = hello.kv_list().unwrap();
    assert!(kv.contains(&(&b"version"[..], Typed::String(b"2.0"))));
    assert!(kv.contains(&(&b"max-frame-size"[..], Typed::Uint32(4096))));

    let args = [
        ("domain", Typed::String(b"edge")),
        ("0.api_key", Typed::String(b"k1")),
    ];
    for (frame_id, remaining) in [(1, 1u32), (2, 0)] {
        s.write_all(&notify(frame_id, &args)).await.unwrap();
        let ack = read_frame(&mut s).await;
        let f = Frame::parse(&ack).unwrap();
        assert_eq!((f.stream_id, f.frame_id), (1, frame_id));
        let v = vars(&ack);
        assert!(v.contains(&("over".into(), Typed::Bool(false))), "{v:?}");
        assert!(
            v.contains(&("remaining".into(), Typed::Uint32(remaining))),
            "{v:?}"
        );
        assert!(v.contains(&("limit".into(), Typed::Uint32(2))), "{v:?}");
    }
    // Pipelined: two NOTIFY frames before reading; both answered, in order.
    let mut both = notify(3, &args);
    both.extend(notify(
        4,
        &[
            ("domain", Typed::String(b"edge")),
            ("0.api_key", Typed::Null),
        ],
    ));
    s.write_all(&both).await.unwrap();
    let over = vars(&read_frame(&mut s).await);
    assert!(
        over.contains(&("code".into(), Typed::String(b"OVER_LIMIT"))),
        "{over:?}"
    );
    assert!(
        over.contains(&("over".into(), Typed::Bool(true))),
        "{over:?}"
    );
    assert!(
        over.contains(&("reset".into(), Typed::Uint64(58))),
        "{over:?}"
    );
    let absent = vars(&read_frame(&mut s).await);
    assert_eq!(
        absent,
        vec![
            ("code".into(), Typed::String(b"OK")),
            ("over".into(), Typed::Bool(false))
        ]
    );
    // Bad arguments: only `error`.
    s.write_all(&notify(5, &[("0.api_key", Typed::String(b"k"))]))
        .await
        .unwrap();
    let error = vars(&read_frame(&mut s).await);
    assert_eq!(error.len(), 1);
    assert_eq!(error[0].0, "error");

    // HAProxy disconnects; the agent answers with status 0 and closes.
    let bye = frame::kv_payload(&[
        ("status-code", Typed::Uint32(0)),
        ("message", Typed::String(b"")),
    ]);
    s.write_all(&frame::encode(frame::HAPROXY_DISCONNECT, 0, 0, &bye))
        .await
        .unwrap();
    let disconnect = read_frame(&mut s).await;
    let f = Frame::parse(&disconnect).unwrap();
    assert_eq!(f.kind, frame::AGENT_DISCONNECT);
    assert!(
        f.kv_list()
            .unwrap()
            .contains(&(&b"status-code"[..], Typed::Uint32(0)))
    );
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest).await.unwrap(), 0, "closed");
}

/// The AGENT-DISCONNECT status the agent closes with after `bytes`.
async fn disconnect_status(port: u16, bytes: &[u8]) -> Typed<'static> {
    let (mut s, _) = connect(port, 16_380).await;
    s.write_all(bytes).await.unwrap();
    let f = read_frame(&mut s).await;
    let f = Frame::parse(&f).unwrap();
    assert_eq!(f.kind, frame::AGENT_DISCONNECT);
    let kv = f.kv_list().unwrap();
    kv.into_iter()
        .find(|(n, _)| *n == b"status-code")
        .map(|(_, v)| v.clone_static())
        .expect("a status code")
}

#[tokio::test]
async fn oversized_and_malformed_frames_close_with_their_status() {
    let port = agent(512).await;
    // A length past the negotiated size: refused before its bytes are read.
    let too_big = 600u32.to_be_bytes();
    assert_eq!(disconnect_status(port, &too_big).await, Typed::Uint32(3));
    // A NOTIFY whose message is cut short.
    let mut bad = notify(1, &[("domain", Typed::String(b"edge"))]);
    let len = bad.len() as u32 - 4 - 2;
    bad.truncate(bad.len() - 2);
    bad[..4].copy_from_slice(&len.to_be_bytes());
    assert_eq!(disconnect_status(port, &bad).await, Typed::Uint32(4));
    // An unknown frame type.
    let odd = frame::encode(42, 0, 0, &[]);
    assert_eq!(disconnect_status(port, &odd).await, Typed::Uint32(4));
    // A frame within the size cap but over what the byte budget has left.
    let port = agent_with(4096, 1000).await;
    let big = notify(1, &[("domain", Typed::String(&[b'x'; 1500]))]);
    assert_eq!(disconnect_status(port, &big).await, Typed::Uint32(13));
    // The first frame is not a HELLO.
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(&notify(1, &[])).await.unwrap();
    let f = read_frame(&mut s).await;
    assert_eq!(Frame::parse(&f).unwrap().kind, frame::AGENT_DISCONNECT);
}

#[tokio::test]
async fn a_health_check_hello_is_answered_and_closed() {
    let port = agent(4096).await;
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(&hello_frame(&[
        ("supported-versions", Typed::String(b"2.0")),
        ("max-frame-size", Typed::Uint32(16_380)),
        ("capabilities", Typed::String(b"")),
        ("healthcheck", Typed::Bool(true)),
    ]))
    .await
    .unwrap();
    let f = read_frame(&mut s).await;
    assert_eq!(Frame::parse(&f).unwrap().kind, frame::AGENT_HELLO);
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest).await.unwrap(), 0, "closed");
}

#[tokio::test]
async fn a_stopping_agent_says_so_to_every_connection() {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let port = agent_until(4096, 64 * 1024, async {
        let _ = rx.await;
    })
    .await;
    let (mut s, _) = connect(port, 16_380).await;
    let _ = tx.send(());
    let f = read_frame(&mut s).await;
    let f = Frame::parse(&f).unwrap();
    assert_eq!(f.kind, frame::AGENT_DISCONNECT);
    let kv = f.kv_list().unwrap();
    assert!(
        kv.contains(&(&b"status-code"[..], Typed::Uint32(0))),
        "{kv:?}"
    );
    assert!(
        kv.contains(&(&b"message"[..], Typed::String(b"Sluice is shutting down"))),
        "{kv:?}"
    );
    // And it accepts no more, once its task has ended (bounded wait).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
        assert!(tokio::time::Instant::now() < deadline, "still accepting");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_answer_longer_than_the_frame_size_becomes_one_error() {
    let port = agent(512).await;
    let (mut s, _) = connect(port, 16_380).await;
    // Twenty messages without a domain: twenty `error` variables would not fit in 512 bytes.
    let mut payload = Vec::new();
    for _ in 0..20 {
        frame::put_varint(&mut payload, 5);
        payload.extend_from_slice(b"check");
        payload.push(1);
        payload.extend_from_slice(&frame::kv_payload(&[("0.k", Typed::String(b"v"))]));
    }
    let notify = frame::encode(frame::NOTIFY, 1, 9, &payload);
    assert!(notify.len() - 4 <= 512);
    s.write_all(&notify).await.unwrap();
    let ack = read_frame(&mut s).await;
    assert!(ack.len() <= 512, "{} bytes", ack.len());
    let v = vars(&ack);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].0, "error");
}

/// `negative_hits=bool(true)` makes every descriptor a refund: its hits come off, answered OK.
#[tokio::test]
async fn a_negative_hits_argument_refunds_every_descriptor() {
    let args: Vec<(&[u8], Typed<'_>)> = vec![
        (b"domain", Typed::String(b"edge")),
        (b"0.api_key", Typed::String(b"k1")),
        (b"1.api_key", Typed::String(b"k2")),
        (b"negative_hits", Typed::Bool(true)),
    ];
    let r = request_from_args(&args).unwrap();
    assert!(r.descriptors.iter().all(|d| d.negative_hits));
    for (value, negative) in [
        (Typed::Bool(false), false),
        (Typed::String(b"true"), true),
        (Typed::Null, false),
    ] {
        let r = request_from_args(&[
            (b"domain", Typed::String(b"d")),
            (b"negative_hits", value),
            (b"0.k", Typed::String(b"v")),
        ])
        .unwrap();
        assert_eq!(r.descriptors[0].negative_hits, negative);
    }
    let e = request_from_args(&[
        (b"domain", Typed::String(b"d")),
        (b"negative_hits", Typed::Uint32(7)),
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("negative_hits"), "{e}");

    // On the socket: 2 per minute; two pass, the third is over; its refund and another free one
    // place.
    let port = agent(4096).await;
    let (mut s, _) = connect(port, 16_380).await;
    let check = [
        ("domain", Typed::String(b"edge")),
        ("0.api_key", Typed::String(b"k1")),
    ];
    let refund = [
        ("domain", Typed::String(b"edge")),
        ("0.api_key", Typed::String(b"k1")),
        ("negative_hits", Typed::Bool(true)),
    ];
    let mut frame_id = 0;
    let mut send = |args: &[(&str, Typed<'_>)]| {
        frame_id += 1;
        notify(frame_id, args)
    };
    for over in [false, false, true] {
        s.write_all(&send(&check)).await.unwrap();
        let v = vars(&read_frame(&mut s).await);
        assert!(v.contains(&("over".into(), Typed::Bool(over))), "{v:?}");
    }
    for remaining in [0u32, 1] {
        s.write_all(&send(&refund)).await.unwrap();
        let v = vars(&read_frame(&mut s).await);
        assert!(v.contains(&("code".into(), Typed::String(b"OK"))), "{v:?}");
        assert!(
            v.contains(&("remaining".into(), Typed::Uint32(remaining))),
            "{v:?}"
        );
    }
    s.write_all(&send(&check)).await.unwrap();
    let v = vars(&read_frame(&mut s).await);
    assert!(v.contains(&("over".into(), Typed::Bool(false))), "{v:?}");
}
