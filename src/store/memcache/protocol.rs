//! memcached's text protocol, the part the store speaks: `get`/`gets`, `incr`, `add`, `cas`,
//! `delete` and `version`, written into one buffer per round trip and their replies read back
//! in order (memcached answers a connection's commands in the order they came).
//!
//! Every read is bounded: a reply line longer than [`MAX_LINE_BYTES`] or a value longer than
//! [`MAX_VALUE_BYTES`] is a protocol error, never a buffer that grows with what the server
//! sends. After any error the connection's state is unknown and it is closed, not reused.

use std::fmt::Write as _;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

use crate::key::memcached_legal;

/// The longest reply line read: `VALUE <key> <flags> <bytes> <cas unique>` for the longest
/// key ([`crate::key::MEMCACHED_MAX_KEY_BYTES`]), with room to spare; `SERVER_ERROR`
/// messages are shorter.
pub(crate) const MAX_LINE_BYTES: usize = 512;
/// The largest value read. Counters are decimal numbers: a fixed window's count is at most 20
/// digits, a bucket's arrival time 33 characters (20 digits, a point and 12 places), a sliding
/// window's state word 39 digits.
pub const MAX_VALUE_BYTES: usize = 64;

/// Why a call on a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The connection failed (refused, reset, closed): memcached may be gone.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The reply was not what the protocol allows: the connection is out of step.
    #[error("unexpected reply from memcached: {0}")]
    Protocol(String),
    /// memcached answered with an error (`ERROR`, `CLIENT_ERROR`, `SERVER_ERROR`): it is there.
    #[error("memcached answered {0}")]
    Server(String),
}

/// What a command's reply is read as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// `get`/`gets`: `VALUE` blocks, then `END`.
    Values,
    /// `incr`: the new value or `NOT_FOUND`.
    Number,
    /// `add`/`cas`: `STORED`, `NOT_STORED`, `EXISTS` or `NOT_FOUND`.
    Stored,
    /// `delete`: `DELETED` or `NOT_FOUND`.
    Deleted,
    /// `version`: `VERSION <text>`.
    Version,
}

/// One value a `get` or `gets` returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub key: String,
    pub value: Vec<u8>,
    /// The `cas unique` (`gets` only).
    pub cas: Option<u64>,
}

impl Item {
    /// The value as a decimal number; `None` if it is not one.
    pub fn number(&self) -> Option<u128> {
        std::str::from_utf8(&self.value).ok()?.trim().parse().ok()
    }
}

/// One command's reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Values(Vec<Item>),
    /// `incr`'s new value.
    Number(u64),
    Stored,
    NotStored,
    Exists,
    NotFound,
    Deleted,
    Version(String),
}

/// Commands for one round trip, in order.
#[derive(Default, Debug)]
pub struct Batch {
    bytes: Vec<u8>,
    expects: Vec<Expect>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.expects.is_empty()
    }

    pub fn len(&self) -> usize {
        self.expects.len()
    }

    fn push(&mut self, expect: Expect, line: std::fmt::Arguments<'_>) {
        let mut text = String::new();
        let _ = text.write_fmt(line);
        self.bytes.extend_from_slice(text.as_bytes());
        self.bytes.extend_from_slice(b"\r\n");
        self.expects.push(expect);
    }

    /// `get k1 k2 ...`: the values found (missing keys are left out).
    pub fn get(&mut self, keys: &[&str]) {
        debug_assert!(keys.iter().all(|k| memcached_legal(k)));
        self.push(Expect::Values, format_args!("get {}", keys.join(" ")));
    }

    /// `gets key`: the value and its `cas unique`.
    pub fn gets(&mut self, key: &str) {
        debug_assert!(memcached_legal(key));
        self.push(Expect::Values, format_args!("gets {key}"));
    }

    /// `incr key by`: the new value, or `NOT_FOUND`.
    pub fn incr(&mut self, key: &str, by: u64) {
        debug_assert!(memcached_legal(key));
        self.push(Expect::Number, format_args!("incr {key} {by}"));
    }

    /// `decr key by`: the new value, floored at 0 by memcached itself, or `NOT_FOUND`.
    pub fn decr(&mut self, key: &str, by: u64) {
        debug_assert!(memcached_legal(key));
        self.push(Expect::Number, format_args!("decr {key} {by}"));
    }

    /// `set key 0 exptime n` and the value: stored whether or not the key exists.
    pub fn set(&mut self, key: &str, value: &str, exptime: u64) {
        self.store("set", key, value, exptime, None);
    }

    /// `add key 0 exptime n` and the value: stored unless the key exists.
    pub fn add(&mut self, key: &str, value: &str, exptime: u64) {
        self.store("add", key, value, exptime, None);
    }

    /// `cas key 0 exptime n unique` and the value: stored unless the key changed since `gets`.
    pub fn cas(&mut self, key: &str, value: &str, exptime: u64, unique: u64) {
        self.store("cas", key, value, exptime, Some(unique));
    }

    fn store(&mut self, verb: &str, key: &str, value: &str, exptime: u64, unique: Option<u64>) {
        debug_assert!(memcached_legal(key));
        let n = value.len();
        match unique {
            Some(u) => self.push(
                Expect::Stored,
                format_args!("{verb} {key} 0 {exptime} {n} {u}"),
            ),
            None => self.push(Expect::Stored, format_args!("{verb} {key} 0 {exptime} {n}")),
        }
        self.bytes.extend_from_slice(value.as_bytes());
        self.bytes.extend_from_slice(b"\r\n");
    }

    /// `delete key`.
    pub fn delete(&mut self, key: &str) {
        debug_assert!(memcached_legal(key));
        self.push(Expect::Deleted, format_args!("delete {key}"));
    }

    /// `version`: what the probe sends.
    pub fn version(&mut self) {
        self.push(Expect::Version, format_args!("version"));
    }

    /// The bytes to write.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Reads one reply per command, in order.
    pub async fn read_replies<R: AsyncBufRead + Unpin>(
        &self,
        r: &mut R,
    ) -> Result<Vec<Reply>, CallError> {
        let mut line = Vec::with_capacity(64);
        let mut replies = Vec::with_capacity(self.expects.len());
        for &expect in &self.expects {
            replies.push(read_reply(r, expect, &mut line).await?);
        }
        Ok(replies)
    }
}

/// Reads one line, without its `\r\n`, into `buf`; at most [`MAX_LINE_BYTES`].
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> Result<(), CallError> {
    buf.clear();
    loop {
        let available = r.fill_buf().await?;
        if available.is_empty() {
            return Err(CallError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "memcached closed the connection",
            )));
        }
        let (taken, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (available.len(), false),
        };
        buf.extend_from_slice(&available[..taken]);
        r.consume(taken);
        if buf.len() > MAX_LINE_BYTES + 2 {
            return Err(CallError::Protocol(format!(
                "a reply line longer than {MAX_LINE_BYTES} bytes"
            )));
        }
        if done {
            break;
        }
    }
    if !buf.ends_with(b"\r\n") {
        return Err(CallError::Protocol("a reply line not ended by CRLF".into()));
    }
    buf.truncate(buf.len() - 2);
    Ok(())
}

fn error_reply(line: &str) -> Option<CallError> {
    (line == "ERROR" || line.starts_with("CLIENT_ERROR") || line.starts_with("SERVER_ERROR"))
        .then(|| CallError::Server(line.to_owned()))
}

async fn read_reply<R: AsyncBufRead + Unpin>(
    r: &mut R,
    expect: Expect,
    buf: &mut Vec<u8>,
) -> Result<Reply, CallError> {
    read_line(r, buf).await?;
    let line = String::from_utf8_lossy(buf).into_owned();
    if let Some(e) = error_reply(&line) {
        return Err(e);
    }
    let unexpected = || CallError::Protocol(format!("{line:?} to a {expect:?} command"));
    match expect {
        Expect::Values => read_values(r, line, buf).await,
        Expect::Number if line == "NOT_FOUND" => Ok(Reply::NotFound),
        Expect::Number => line.parse().map(Reply::Number).map_err(|_| unexpected()),
        Expect::Stored => match line.as_str() {
            "STORED" => Ok(Reply::Stored),
            "NOT_STORED" => Ok(Reply::NotStored),
            "EXISTS" => Ok(Reply::Exists),
            "NOT_FOUND" => Ok(Reply::NotFound),
            _ => Err(unexpected()),
        },
        Expect::Deleted => match line.as_str() {
            "DELETED" => Ok(Reply::Deleted),
            "NOT_FOUND" => Ok(Reply::NotFound),
            _ => Err(unexpected()),
        },
        Expect::Version => line
            .strip_prefix("VERSION ")
            .map(|v| Reply::Version(v.to_owned()))
            .ok_or_else(unexpected),
    }
}

/// `VALUE <key> <flags> <bytes> [<cas unique>]` blocks until `END`; `first` is the line read.
async fn read_values<R: AsyncBufRead + Unpin>(
    r: &mut R,
    first: String,
    buf: &mut Vec<u8>,
) -> Result<Reply, CallError> {
    let mut items = Vec::new();
    let mut line = first;
    while line != "END" {
        let bad = || CallError::Protocol(format!("{line:?} in a get's reply"));
        let mut parts = line.split(' ');
        let (Some("VALUE"), Some(key), Some(_flags), Some(bytes)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let bytes: usize = bytes.parse().map_err(|_| bad())?;
        let cas = match parts.next() {
            Some(c) => Some(c.parse::<u64>().map_err(|_| bad())?),
            None => None,
        };
        if bytes > MAX_VALUE_BYTES {
            return Err(CallError::Protocol(format!(
                "the value of {key} is {bytes} bytes, more than any counter's {MAX_VALUE_BYTES}"
            )));
        }
        let mut value = vec![0; bytes + 2];
        r.read_exact(&mut value).await?;
        if !value.ends_with(b"\r\n") {
            return Err(CallError::Protocol(format!(
                "the value of {key} is not ended by CRLF"
            )));
        }
        value.truncate(bytes);
        items.push(Item {
            key: key.to_owned(),
            value,
            cas,
        });
        read_line(r, buf).await?;
        line = String::from_utf8_lossy(buf).into_owned();
    }
    Ok(Reply::Values(items))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn replies(batch: &Batch, wire: &[u8]) -> Result<Vec<Reply>, CallError> {
        let mut r = tokio::io::BufReader::new(wire);
        batch.read_replies(&mut r).await
    }

    #[test]
    fn commands_are_written_as_the_protocol_says() {
        let mut b = Batch::default();
        b.get(&["a", "b"]);
        b.gets("c");
        b.incr("a", 3);
        b.add("a", "3", 60);
        b.cas("c", "17", 120, 99);
        b.delete("a");
        b.version();
        assert_eq!(
            String::from_utf8(b.bytes().to_vec()).unwrap(),
            "get a b\r\ngets c\r\nincr a 3\r\nadd a 0 60 1\r\n3\r\ncas c 0 120 2 99\r\n17\r\n\
             delete a\r\nversion\r\n"
        );
        assert_eq!(b.len(), 7);
    }

    #[tokio::test]
    async fn replies_are_read_in_order() {
        let mut b = Batch::default();
        b.get(&["a", "b"]);
        b.gets("c");
        b.incr("a", 1);
        b.incr("z", 1);
        b.add("a", "1", 1);
        b.cas("c", "1", 1, 5);
        b.delete("z");
        b.version();
        let wire =
            b"VALUE a 0 2\r\n41\r\nEND\r\nVALUE c 0 3 77\r\n100\r\nEND\r\n42\r\nNOT_FOUND\r\n\
NOT_STORED\r\nEXISTS\r\nNOT_FOUND\r\nVERSION 1.6.18\r\n";
        let got = replies(&b, wire).await.unwrap();
        assert_eq!(
            got,
            vec![
                Reply::Values(vec![Item {
                    key: "a".into(),
                    value: b"41".to_vec(),
                    cas: None
                }]),
                Reply::Values(vec![Item {
                    key: "c".into(),
                    value: b"100".to_vec(),
                    cas: Some(77)
                }]),
                Reply::Number(42),
                Reply::NotFound,
                Reply::NotStored,
                Reply::Exists,
                Reply::NotFound,
                Reply::Version("1.6.18".into()),
            ]
        );
    }

    #[tokio::test]
    async fn errors_and_oversized_replies_are_refused() {
        let mut b = Batch::default();
        b.incr("a", 1);
        let e = replies(&b, b"SERVER_ERROR out of memory\r\n")
            .await
            .unwrap_err();
        assert!(
            matches!(e, CallError::Server(ref m) if m.contains("out of memory")),
            "{e}"
        );
        let e = replies(
            &b,
            b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
        )
        .await
        .unwrap_err();
        assert!(matches!(e, CallError::Server(_)), "{e}");
        let e = replies(&b, b"STORED\r\n").await.unwrap_err();
        assert!(matches!(e, CallError::Protocol(_)), "{e}");
        let e = replies(&b, b"42").await.unwrap_err();
        assert!(matches!(e, CallError::Io(_)), "{e}");
        let long = format!("{}\r\n", "9".repeat(MAX_LINE_BYTES + 1));
        let e = replies(&b, long.as_bytes()).await.unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");

        let mut g = Batch::default();
        g.get(&["a"]);
        let big = format!("VALUE a 0 {}\r\n", MAX_VALUE_BYTES + 1);
        let e = replies(&g, big.as_bytes()).await.unwrap_err();
        assert!(e.to_string().contains("more than any counter"), "{e}");
        let e = replies(&g, b"VALUE a 0 2\r\n41xx").await.unwrap_err();
        assert!(e.to_string().contains("CRLF"), "{e}");
        let e = replies(&g, b"VALUE a\r\n").await.unwrap_err();
        assert!(matches!(e, CallError::Protocol(_)), "{e}");
    }

    #[test]
    fn numbers_are_read_from_values() {
        let item = |v: &[u8]| Item {
            key: "k".into(),
            value: v.to_vec(),
            cas: None,
        };
        assert_eq!(item(b"17").number(), Some(17));
        assert_eq!(
            item(b"17  ").number(),
            Some(17),
            "incr pads a shrunk value with spaces"
        );
        assert_eq!(item(b"x").number(), None);
    }
}
