//! A TCP relay in the test process, in front of one node's peer port, that can cut every call
//! to that node at once (`runtime_replicas.rs`): while cut, each open connection is shut down
//! and each new one closed as soon as it is accepted, so a call fails at once instead of
//! waiting out its deadline, and none of its bytes reach the node. Calls the node makes itself
//! do not go through it.

#![allow(
    clippy::disallowed_methods,
    reason = "the relay copies real bytes between real sockets"
)]

use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// What the relay's threads share.
#[derive(Default)]
struct Shared {
    cut: AtomicBool,
    stop: AtomicBool,
    /// Every connection's two sockets, shut down by a cut or on drop.
    open: Mutex<Vec<TcpStream>>,
}

/// Relays 127.0.0.1:`port` to 127.0.0.1:`target`; stopped on drop.
pub struct Relay {
    pub port: u16,
    shared: Arc<Shared>,
}

impl Relay {
    pub fn start(port: u16, target: u16) -> Relay {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind the relay");
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                if s.cut.load(Ordering::SeqCst) {
                    let _ = conn.shutdown(Shutdown::Both);
                    continue;
                }
                relay(conn, target, &s);
            }
        });
        Relay { port, shared }
    }

    /// Cuts every call to the node (`true`), or lets them through again (`false`).
    pub fn cut(&self, cut: bool) {
        self.shared.cut.store(cut, Ordering::SeqCst);
        if cut {
            for s in self.shared.open.lock().unwrap().drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.cut(true);
        // Wakes the accept loop, which then sees the stop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Copies both ways between `client` and a new connection to `target`, on two threads.
fn relay(client: TcpStream, target: u16, shared: &Arc<Shared>) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let clones = (client.try_clone(), server.try_clone());
    let (Ok(client_2), Ok(server_2)) = clones else {
        return;
    };
    {
        let mut open = shared.open.lock().unwrap();
        for s in [&client, &server] {
            if let Ok(s) = s.try_clone() {
                open.push(s);
            }
        }
    }
    for (mut from, mut to) in [(client, server), (server_2, client_2)] {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
        });
    }
}
