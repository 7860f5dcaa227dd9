//! A scripted HTTP/1.1 server for the tools' tests, on a std listener on port 0: it answers
//! each request it reads with the next [`Reply`], byte for byte as written (so a test chooses
//! the framing: `Content-Length`, chunked, none), keeps a connection open until the client or
//! a reply closes it, and records every request it read.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// One answer, as bytes on the wire.
pub(super) struct Reply {
    bytes: Vec<u8>,
    /// Close the connection after writing.
    close: bool,
    /// Then wait this long before anything else (the client's deadline passes meanwhile).
    stall: Duration,
}

impl Reply {
    /// `status` with `body` framed by `Content-Length`; the connection stays open.
    pub(super) fn length(status: u16, body: &str) -> Self {
        let head = format!(
            "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        Reply::raw([head.as_bytes(), body.as_bytes()].concat())
    }

    /// `status` with `chunks` in chunked transfer encoding (the last, empty chunk included).
    pub(super) fn chunked(status: u16, chunks: &[&str]) -> Self {
        let mut text = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\n\r\n"
        );
        for c in chunks {
            text.push_str(&format!("{:x}\r\n{c}\r\n", c.len()));
        }
        text.push_str("0\r\n\r\n");
        Reply::raw(text.into_bytes())
    }

    /// Exactly these bytes; the connection stays open.
    pub(super) fn raw(bytes: impl Into<Vec<u8>>) -> Self {
        Reply {
            bytes: bytes.into(),
            close: false,
            stall: Duration::ZERO,
        }
    }

    /// Closes the connection once written.
    pub(super) fn then_close(mut self) -> Self {
        self.close = true;
        self
    }

    /// Holds the connection this long once written, sending nothing more.
    pub(super) fn then_stall(mut self, stall: Duration) -> Self {
        self.stall = stall;
        self
    }
}

/// The running server; [`Server::requests`] waits for it to give its last reply.
pub(super) struct Server {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    seen: Arc<Mutex<Seen>>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Seen {
    requests: Vec<String>,
    connections: usize,
}

/// Serves `replies` in order, then stops.
pub(super) fn serve(replies: Vec<Reply>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let record = seen.clone();
    let thread = std::thread::spawn(move || {
        let mut replies = replies.into_iter().peekable();
        while replies.peek().is_some() {
            let (stream, _) = listener.accept().unwrap();
            record.lock().unwrap().connections += 1;
            answer_on(stream, &mut replies, &record);
        }
    });
    Server {
        addr,
        seen,
        thread: Some(thread),
    }
}

/// Answers requests on one connection until the replies run out, one closes it, or the
/// client does.
fn answer_on(stream: TcpStream, replies: &mut impl Iterator<Item = Reply>, seen: &Mutex<Seen>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut stream = stream;
    while let Some(request) = read_request(&mut reader) {
        seen.lock().unwrap().requests.push(request);
        let Some(reply) = replies.next() else { return };
        // The client may have given up already (a test of its limits).
        let _ = stream.write_all(&reply.bytes);
        std::thread::sleep(reply.stall);
        if reply.close {
            return;
        }
    }
}

/// One request (head and `Content-Length` body) as text, or `None` when the client closed.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<String> {
    let mut text = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        text.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let length = text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .map_or(0, |(_, v)| v.trim().parse().unwrap());
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    text.push_str(&String::from_utf8(body).unwrap());
    Some(text)
}

impl Server {
    /// Every request read, in order, once the last reply is given.
    pub(super) fn requests(&mut self) -> Vec<String> {
        self.finish();
        self.seen.lock().unwrap().requests.clone()
    }

    /// How many connections the client opened, once the last reply is given.
    pub(super) fn connections(&mut self) -> usize {
        self.finish();
        self.seen.lock().unwrap().connections
    }

    fn finish(&mut self) {
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}
