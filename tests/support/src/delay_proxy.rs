//! The fault harness's delay proxy (`integration/faults/`; `integration/regions.rs` delays the
//! links between regions with it too), in the test process (root namespace): one listener per node at
//! the address every node names it by (`10.201.<s>.1:<7000+i>`), relaying to the node itself
//! (`10.201.<s>.<10+i>:<7000+i>`). The connecting node is known by its source address, so each
//! connection is on one peer link, and [`Proxy::set_delay`] delays that link's bytes.
//!
//! Delay D on a link holds every chunk read from either side D before writing it on (so a call
//! and its answer each take D longer, as netem's `delay D` on both ends would), in order.
//! Cuts and loss are not done here but by iptables (`net.rs`), on real packets.
//!
//! Bounds: at most [`MAX_CONNECTIONS`] connections per listener (more are closed at once);
//! per connection and direction a queue of [`QUEUE_CHUNKS`] chunks of at most [`CHUNK_BYTES`]
//! (1 MiB), past which the reading side waits (TCP's own back-pressure then slows the sender);
//! four threads per connection (two readers, two writers), all ended on drop.

#![allow(
    clippy::disallowed_methods,
    reason = "the proxy delays real bytes in real time"
)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Connections one listener relays at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Chunks waiting in one direction of one connection.
pub const QUEUE_CHUNKS: usize = 64;
/// The most bytes read at once.
pub const CHUNK_BYTES: usize = 16 * 1024;

/// What the listeners and their connections share.
struct Shared {
    stop: AtomicBool,
    /// Delay per link, as (lower node, higher node).
    delays: Mutex<HashMap<(usize, usize), Duration>>,
    /// Each open connection's two sockets, shut down on drop to end its threads; taken out
    /// when its last thread ends.
    open: Mutex<HashMap<u64, [TcpStream; 2]>>,
    /// Numbers the connections.
    next: AtomicUsize,
}

/// The listeners, one per node; stopped on drop.
pub struct Proxy {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Listens on `listen[i]` for node `i`, relaying to `target[i]`; `node_of` names the node a
    /// connecting address belongs to.
    pub fn start(
        listen: Vec<SocketAddr>,
        target: Vec<SocketAddr>,
        node_of: impl Fn(IpAddr) -> Option<usize> + Send + Sync + 'static,
    ) -> Proxy {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            delays: Mutex::default(),
            open: Mutex::default(),
            next: AtomicUsize::new(0),
        });
        let node_of = Arc::new(node_of);
        let threads = listen
            .into_iter()
            .zip(target)
            .enumerate()
            .map(|(to, (at, target))| {
                let listener = TcpListener::bind(at).unwrap_or_else(|e| panic!("bind {at}: {e}"));
                listener.set_nonblocking(true).expect("nonblocking");
                let (shared, node_of) = (shared.clone(), node_of.clone());
                std::thread::spawn(move || accept_loop(&listener, target, to, &shared, &*node_of))
            })
            .collect();
        Proxy { shared, threads }
    }

    /// Delays the link between nodes `a` and `b` by `delay` each way (zero: no delay).
    pub fn set_delay(&self, a: usize, b: usize, delay: Duration) {
        let mut delays = self.shared.delays.lock().unwrap();
        delays.insert((a.min(b), a.max(b)), delay);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for (_, pair) in self.shared.open.lock().unwrap().drain() {
            for s in pair {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Accepts connections for node `to` until stopped; each is relayed by its own threads.
fn accept_loop(
    listener: &TcpListener,
    target: SocketAddr,
    to: usize,
    shared: &Arc<Shared>,
    node_of: &(dyn Fn(IpAddr) -> Option<usize> + Send + Sync),
) {
    let live = Arc::new(AtomicUsize::new(0));
    let mut relays = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        let (client, from) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(_) => continue,
        };
        let link = node_of(from.ip()).map(|f| (f.min(to), f.max(to)));
        if live.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            continue;
        }
        let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) else {
            continue;
        };
        relays.extend(relay(client, server, link, shared, &live));
        relays.retain(|t: &std::thread::JoinHandle<()>| !t.is_finished());
    }
    // Connections this loop took after the drop's shutdown are shut down here.
    for (_, pair) in shared.open.lock().unwrap().drain() {
        for s in pair {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
    for t in relays {
        let _ = t.join();
    }
}

/// Keeps one connection's sockets in [`Shared::open`] while any of its four threads runs.
struct Registered {
    shared: Arc<Shared>,
    id: u64,
    live: Arc<AtomicUsize>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.shared.open.lock().unwrap().remove(&self.id);
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Relays one connection both ways; returns its threads.
fn relay(
    client: TcpStream,
    server: TcpStream,
    link: Option<(usize, usize)>,
    shared: &Arc<Shared>,
    live: &Arc<AtomicUsize>,
) -> Vec<std::thread::JoinHandle<()>> {
    let _ = client.set_nonblocking(false);
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let id = shared.next.fetch_add(1, Ordering::Relaxed) as u64;
    let clone = |s: &TcpStream| s.try_clone().expect("clone socket");
    shared
        .open
        .lock()
        .unwrap()
        .insert(id, [clone(&client), clone(&server)]);
    live.fetch_add(1, Ordering::Relaxed);
    let guard = Arc::new(Registered {
        shared: shared.clone(),
        id,
        live: live.clone(),
    });
    let (client2, server2) = (clone(&client), clone(&server));
    let mut threads = pump(client, server2, link, shared, &guard);
    threads.extend(pump(server, client2, link, shared, &guard));
    threads
}

/// One direction: a reader stamping each chunk with when it is due, a writer sending it then.
fn pump(
    from: TcpStream,
    to: TcpStream,
    link: Option<(usize, usize)>,
    shared: &Arc<Shared>,
    guard: &Arc<Registered>,
) -> Vec<std::thread::JoinHandle<()>> {
    let (tx, rx) = sync_channel::<(Instant, Vec<u8>)>(QUEUE_CHUNKS);
    let (shared, reading, writing) = (shared.clone(), guard.clone(), guard.clone());
    let reader = std::thread::spawn(move || {
        read_side(from, &tx, link, &shared);
        drop(reading);
    });
    let writer = std::thread::spawn(move || {
        write_side(to, &rx);
        drop(writing);
    });
    vec![reader, writer]
}

fn read_side(
    mut from: TcpStream,
    tx: &SyncSender<(Instant, Vec<u8>)>,
    link: Option<(usize, usize)>,
    shared: &Shared,
) {
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let delay = link
            .and_then(|l| shared.delays.lock().unwrap().get(&l).copied())
            .unwrap_or_default();
        if tx
            .send((Instant::now() + delay, buf[..n].to_vec()))
            .is_err()
        {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Read);
}

fn write_side(mut to: TcpStream, rx: &Receiver<(Instant, Vec<u8>)>) {
    for (due, bytes) in rx {
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        if to.write_all(&bytes).is_err() {
            // The other direction reads this socket: end it too.
            let _ = to.shutdown(Shutdown::Both);
            return;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
