//! SPOP, HAProxy's Stream Processing Offload Protocol (version 2.0, `doc/SPOE.txt` in HAProxy's
//! sources): frames, typed data and HAProxy's variable-length integers, decoded from and
//! encoded into byte slices with every length checked. Nothing here does I/O.
//!
//! Written here rather than taken from the `spop` crate: the protocol is a few hundred lines,
//! the crate is pre-1.0 with breaking releases every few weeks, and every bound on what a peer
//! can make Sluice read or allocate should be in code this project tests (the frame length
//! is checked by the agent before any byte is read; here, no length is trusted past the input).
//!
//! ```text
//! FRAME       : <FRAME-LENGTH:4 bytes, big-endian> <FRAME-TYPE:1> <FLAGS:4> <STREAM-ID:varint>
//!               <FRAME-ID:varint> <PAYLOAD>
//! TYPED-DATA  : <TYPE:4 bits><FLAGS:4 bits><DATA>
//! ```

use std::net::{Ipv4Addr, Ipv6Addr};

/// Frame types (SPOE.txt 3.2.2).
pub(super) const HAPROXY_HELLO: u8 = 1;
pub(super) const HAPROXY_DISCONNECT: u8 = 2;
pub(super) const NOTIFY: u8 = 3;
pub(super) const AGENT_HELLO: u8 = 101;
pub(super) const AGENT_DISCONNECT: u8 = 102;
pub(super) const ACK: u8 = 103;

/// The FIN flag: every frame carries it (fragmentation is deprecated); ABORT cancels one.
pub(super) const FLAG_FIN: u32 = 1;
pub(super) const FLAG_ABORT: u32 = 2;

/// The smallest frame size a peer may announce.
pub(super) const MIN_FRAME_SIZE: u32 = 256;

/// Status codes of a DISCONNECT frame (SPOE.txt 3.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Status {
    Normal = 0,
    Io = 1,
    Timeout = 2,
    TooBig = 3,
    Invalid = 4,
    NoVersion = 5,
    NoFrameSize = 6,
    NoCapabilities = 7,
    BadVersion = 8,
    BadFrameSize = 9,
    FragmentationNotSupported = 10,
    ResourceAllocation = 13,
}

/// Why bytes are not a frame; answered with an AGENT-DISCONNECT of [`Status::Invalid`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum FrameError {
    #[error("the frame ends inside {0}")]
    Truncated(&'static str),
    #[error("a variable-length integer is longer than 10 bytes")]
    VarintTooLong,
    #[error("typed data of unknown type {0}")]
    UnknownType(u8),
}

/// One decoded value (SPOE.txt 3.1).
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Typed<'a> {
    Null,
    Bool(bool),
    Int32(i32),
    Uint32(u32),
    Int64(i64),
    Uint64(u64),
    Ipv4(Ipv4Addr),
    Ipv6(Ipv6Addr),
    String(&'a [u8]),
    Binary(&'a [u8]),
}

#[cfg(test)]
impl Typed<'_> {
    /// The value, owning nothing borrowed (strings are leaked: tests only).
    pub(super) fn clone_static(&self) -> Typed<'static> {
        match self {
            Typed::Null => Typed::Null,
            Typed::Bool(b) => Typed::Bool(*b),
            Typed::Int32(n) => Typed::Int32(*n),
            Typed::Uint32(n) => Typed::Uint32(*n),
            Typed::Int64(n) => Typed::Int64(*n),
            Typed::Uint64(n) => Typed::Uint64(*n),
            Typed::Ipv4(a) => Typed::Ipv4(*a),
            Typed::Ipv6(a) => Typed::Ipv6(*a),
            Typed::String(s) => Typed::String(s.to_vec().leak()),
            Typed::Binary(b) => Typed::Binary(b.to_vec().leak()),
        }
    }
}

/// A frame's header and payload, borrowed from the bytes after its length prefix.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Frame<'a> {
    pub kind: u8,
    pub flags: u32,
    pub stream_id: u64,
    pub frame_id: u64,
    pub payload: &'a [u8],
}

/// A cursor over a frame's bytes; every read checks what is left.
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], FrameError> {
        if self.bytes.len() < n {
            return Err(FrameError::Truncated(what));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    pub(super) fn byte(&mut self, what: &'static str) -> Result<u8, FrameError> {
        Ok(self.take(1, what)?[0])
    }

    /// HAProxy's varint: below 240 one byte; else the low 4 bits in the first byte (whose high
    /// nibble is `1111`), then 7 bits per byte while the high bit is set.
    pub(super) fn varint(&mut self, what: &'static str) -> Result<u64, FrameError> {
        let first = self.byte(what)?;
        let mut value = u64::from(first);
        if first < 240 {
            return Ok(value);
        }
        let mut shift = 4u32;
        for _ in 0..9 {
            let b = self.byte(what)?;
            value = value.wrapping_add(u64::from(b) << shift);
            if b < 128 {
                return Ok(value);
            }
            shift += 7;
        }
        Err(FrameError::VarintTooLong)
    }

    /// A varint-prefixed run of bytes (a STRING's or BINARY's data, a name).
    pub(super) fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], FrameError> {
        let len = self.varint(what)?;
        let len = usize::try_from(len).map_err(|_| FrameError::Truncated(what))?;
        self.take(len, what)
    }

    /// One TYPED-DATA.
    pub(super) fn typed(&mut self) -> Result<Typed<'a>, FrameError> {
        let head = self.byte("a value's type")?;
        let what = "a value";
        Ok(match head & 0x0f {
            0 => Typed::Null,
            1 => Typed::Bool(head & 0x10 != 0),
            // Signed integers travel as their two's complement, cast like HAProxy's C does.
            2 => Typed::Int32(self.varint(what)? as u32 as i32),
            3 => Typed::Uint32(self.varint(what)? as u32),
            4 => Typed::Int64(self.varint(what)? as i64),
            5 => Typed::Uint64(self.varint(what)?),
            6 => {
                let b: [u8; 4] = self
                    .take(4, "an IPv4 address")?
                    .try_into()
                    .unwrap_or([0; 4]);
                Typed::Ipv4(Ipv4Addr::from(b))
            }
            7 => {
                let b: [u8; 16] = self
                    .take(16, "an IPv6 address")?
                    .try_into()
                    .unwrap_or([0; 16]);
                Typed::Ipv6(Ipv6Addr::from(b))
            }
            8 => Typed::String(self.bytes(what)?),
            9 => Typed::Binary(self.bytes(what)?),
            other => return Err(FrameError::UnknownType(other)),
        })
    }

    /// A KV-LIST item: a name and a value.
    pub(super) fn kv(&mut self) -> Result<(&'a [u8], Typed<'a>), FrameError> {
        let name = self.bytes("a name")?;
        Ok((name, self.typed()?))
    }
}

impl<'a> Frame<'a> {
    /// Decodes the bytes after a frame's length prefix.
    pub(super) fn parse(bytes: &'a [u8]) -> Result<Self, FrameError> {
        let mut r = Reader::new(bytes);
        let kind = r.byte("the frame type")?;
        let flags = r.take(4, "the flags")?;
        let flags = u32::from_be_bytes([flags[0], flags[1], flags[2], flags[3]]);
        let stream_id = r.varint("the stream id")?;
        let frame_id = r.varint("the frame id")?;
        Ok(Frame {
            kind,
            flags,
            stream_id,
            frame_id,
            payload: r.bytes,
        })
    }

    /// A KV-LIST payload (HELLO, DISCONNECT) as name/value pairs.
    pub(super) fn kv_list(&self) -> Result<Vec<(&'a [u8], Typed<'a>)>, FrameError> {
        let mut r = Reader::new(self.payload);
        let mut out = Vec::new();
        while !r.is_empty() {
            out.push(r.kv()?);
        }
        Ok(out)
    }
}

/// One message of a NOTIFY frame: its name and arguments.
pub(super) type Message<'a> = (&'a [u8], Vec<(&'a [u8], Typed<'a>)>);

/// A NOTIFY payload: `<MESSAGE-NAME> <NB-ARGS:1 byte> <KV-LIST>`, repeated.
pub(super) fn messages(payload: &[u8]) -> Result<Vec<Message<'_>>, FrameError> {
    let mut r = Reader::new(payload);
    let mut out = Vec::new();
    while !r.is_empty() {
        let name = r.bytes("a message name")?;
        let count = r.byte("a message's argument count")?;
        let args = (0..count).map(|_| r.kv()).collect::<Result<Vec<_>, _>>()?;
        out.push((name, args));
    }
    Ok(out)
}

/// Appends HAProxy's varint encoding of `value`.
pub(super) fn put_varint(out: &mut Vec<u8>, value: u64) {
    if value < 240 {
        out.push(value as u8);
        return;
    }
    out.push((value as u8) | 0xf0);
    let mut rest = (value - 240) >> 4;
    while rest >= 128 {
        out.push((rest as u8) | 0x80);
        rest = (rest - 128) >> 7;
    }
    out.push(rest as u8);
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Appends one TYPED-DATA.
pub(super) fn put_typed(out: &mut Vec<u8>, value: &Typed<'_>) {
    match value {
        Typed::Null => out.push(0),
        Typed::Bool(b) => out.push(1 | if *b { 0x10 } else { 0 }),
        Typed::Int32(v) => {
            out.push(2);
            put_varint(out, u64::from(*v as u32));
        }
        Typed::Uint32(v) => {
            out.push(3);
            put_varint(out, u64::from(*v));
        }
        Typed::Int64(v) => {
            out.push(4);
            put_varint(out, *v as u64);
        }
        Typed::Uint64(v) => {
            out.push(5);
            put_varint(out, *v);
        }
        Typed::Ipv4(a) => {
            out.push(6);
            out.extend_from_slice(&a.octets());
        }
        Typed::Ipv6(a) => {
            out.push(7);
            out.extend_from_slice(&a.octets());
        }
        Typed::String(s) => {
            out.push(8);
            put_bytes(out, s);
        }
        Typed::Binary(b) => {
            out.push(9);
            put_bytes(out, b);
        }
    }
}

/// A whole frame, length prefix included, with the FIN flag.
pub(super) fn encode(kind: u8, stream_id: u64, frame_id: u64, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(16 + payload.len());
    body.push(kind);
    body.extend_from_slice(&FLAG_FIN.to_be_bytes());
    put_varint(&mut body, stream_id);
    put_varint(&mut body, frame_id);
    body.extend_from_slice(payload);
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// A KV-LIST payload.
pub(super) fn kv_payload(items: &[(&str, Typed<'_>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in items {
        put_bytes(&mut out, name.as_bytes());
        put_typed(&mut out, value);
    }
    out
}

/// Variable scopes of a `set-var` action.
pub(super) const SCOPE_TRANSACTION: u8 = 2;
const SET_VAR: u8 = 1;

/// Appends a `set-var` action: `<SET-VAR:1> <NB-ARGS:3> <SCOPE:1> <NAME> <VALUE>`.
pub(super) fn put_set_var(out: &mut Vec<u8>, scope: u8, name: &str, value: &Typed<'_>) {
    out.extend_from_slice(&[SET_VAR, 3, scope]);
    put_bytes(out, name.as_bytes());
    put_typed(out, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(bytes: &[u8]) -> Result<u64, FrameError> {
        Reader::new(bytes).varint("test")
    }

    #[test]
    fn varints_match_haproxys_encoding() {
        // The boundaries SPOE.txt lists, each encoded and decoded.
        for (value, len) in [
            (0u64, 1),
            (239, 1),
            (240, 2),
            (2287, 2),
            (2288, 3),
            (264_431, 3),
            (264_432, 4),
            (33_818_863, 4),
            (33_818_864, 5),
            (4_328_786_159, 5),
            (u64::MAX, 10),
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(out.len(), len, "{value}");
            assert_eq!(varint(&out), Ok(value), "{value}");
        }
        // Bytes HAProxy's encode_varint writes: 240 is [0xf0, 0x00], 1000 is [0xf8, 0x2f].
        assert_eq!(varint(&[0xf0, 0x00]), Ok(240));
        assert_eq!(varint(&[0xf8, 0x2f]), Ok(1000));
        assert_eq!(varint(&[0xf0]), Err(FrameError::Truncated("test")));
        assert_eq!(varint(&[0xff; 11]), Err(FrameError::VarintTooLong));
    }

    #[test]
    fn typed_data_round_trips() {
        let values = [
            Typed::Null,
            Typed::Bool(true),
            Typed::Bool(false),
            Typed::Int32(-5),
            Typed::Uint32(u32::MAX),
            Typed::Int64(i64::MIN),
            Typed::Uint64(1 << 40),
            Typed::Ipv4(Ipv4Addr::new(10, 1, 2, 3)),
            Typed::Ipv6(Ipv6Addr::LOCALHOST),
            Typed::String(b"k\xffey"),
            Typed::Binary(&[0, 1, 2]),
        ];
        for v in values {
            let mut out = Vec::new();
            put_typed(&mut out, &v);
            let mut r = Reader::new(&out);
            assert_eq!(r.typed(), Ok(v.clone()));
            assert!(r.is_empty());
        }
        assert_eq!(Reader::new(&[10]).typed(), Err(FrameError::UnknownType(10)));
        assert_eq!(
            Reader::new(&[8, 5, b'a']).typed(),
            Err(FrameError::Truncated("a value"))
        );
        assert_eq!(
            Reader::new(&[6, 1, 2]).typed(),
            Err(FrameError::Truncated("an IPv4 address"))
        );
    }

    #[test]
    fn frames_and_messages_decode_and_never_panic_on_any_prefix() {
        let mut payload = Vec::new();
        put_bytes(&mut payload, b"check");
        payload.push(2);
        put_bytes(&mut payload, b"domain");
        put_typed(&mut payload, &Typed::String(b"edge"));
        put_bytes(&mut payload, b"0.ip");
        put_typed(&mut payload, &Typed::Ipv4(Ipv4Addr::LOCALHOST));
        let bytes = encode(NOTIFY, 7, 300, &payload);
        assert_eq!(
            u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize,
            bytes.len() - 4
        );
        let frame = Frame::parse(&bytes[4..]).unwrap();
        assert_eq!((frame.kind, frame.flags), (NOTIFY, FLAG_FIN));
        assert_eq!((frame.stream_id, frame.frame_id), (7, 300));
        let decoded = messages(frame.payload).unwrap();
        assert_eq!(decoded.len(), 1);
        assert_eq!(decoded[0].0, b"check");
        assert_eq!(decoded[0].1[0], (&b"domain"[..], Typed::String(b"edge")));
        // Every truncation is an error, not a panic.
        for end in 0..payload.len() {
            let _ = messages(&payload[..end]);
        }
        for end in 0..bytes.len() - 4 {
            if let Ok(f) = Frame::parse(&bytes[4..4 + end]) {
                let _ = messages(f.payload);
            }
        }
        assert!(messages(&payload[..payload.len() - 1]).is_err());
    }

    proptest::proptest! {
        /// Any bytes: a frame, its messages and its values decode or are refused, never panic,
        /// and nothing decoded reaches past the input.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            if let Ok(f) = Frame::parse(&bytes) {
                proptest::prop_assert!(f.payload.len() <= bytes.len());
                let _ = f.kv_list();
                if let Ok(messages) = messages(f.payload) {
                    for (name, args) in messages {
                        proptest::prop_assert!(name.len() <= bytes.len());
                        proptest::prop_assert!(args.len() <= 255);
                    }
                }
            }
            let mut r = Reader::new(&bytes);
            while r.typed().is_ok() && !r.is_empty() {}
        }
    }

    #[test]
    fn set_var_actions_are_laid_out_as_the_spec_says() {
        let mut out = Vec::new();
        put_set_var(&mut out, SCOPE_TRANSACTION, "over", &Typed::Bool(true));
        assert_eq!(out, [1, 3, 2, 4, b'o', b'v', b'e', b'r', 0x11]);
    }
}
