//! The peer cluster's configuration, owned here and built by `crate::settings` from PEERS,
//! PEERS_DNS, PEER_* and SLUICE_PEER_* (or by tests directly).

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use super::lease::LeaseTiming;
use super::lease::parent::ParentTiming;
use crate::store::redis::RedisConfig;

/// Where the peers come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerSource {
    Static(Vec<String>),
    Dns { name: String, port: u16 },
}

impl PeerSource {
    /// The peers known at start: the static list, or none until PEERS_DNS first resolves.
    pub fn initial(&self) -> Vec<String> {
        match self {
            PeerSource::Static(list) => list.clone(),
            PeerSource::Dns { .. } => Vec::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterMode {
    /// Every hit decided by its key's owner (one hop for the keys of other nodes).
    Forward,
    /// Each node enforces `ceil(limit / live peers)` alone.
    Divided,
    /// Each node decides from leases its keys' owners grant it (`super::lease`).
    Lease,
}

/// The peer cluster: who the peers are, how this node is reached, and how hits travel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    pub peers: PeerSource,
    pub advertise: String,
    pub listen: SocketAddr,
    pub mode: ClusterMode,
    pub timeout: Duration,
    /// SLUICE_PEER_BATCH_WINDOW_US: how long a call in flight gathers the forwards behind it.
    pub batch_window: Duration,
    /// SLUICE_PEER_WRITE_BEHIND; `None` when off.
    pub write_behind: Option<WriteBehind>,
    /// SLUICE_LEASE_*: lease mode's timing and table bound (unused in the other modes).
    pub lease: LeaseTiming,
    /// SLUICE_LEASE_PARENT: the cluster this one gets its keys' capacity from (lease mode).
    pub parent: Option<ParentConfig>,
}

/// SLUICE_LEASE_PARENT and its SLUICE_LEASE_PARENT_* and SLUICE_LEASE_CLUSTER_NAME: a lease
/// cluster below a parent cluster in a tree (`super::lease::parent`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParentConfig {
    /// The parent cluster's peers (`host:port`), as its own PEERS lists them.
    pub peers: Vec<String>,
    /// This cluster's name, which names its leases at the parent.
    pub name: String,
    pub timing: ParentTiming,
    /// SLUICE_LEASE_PARENT_EXPECTED_CLUSTERS: the child clusters the parent is expected to
    /// have, the safe capacity's divisor before the parent ever answered.
    pub expected_clusters: NonZeroU32,
}

impl ClusterConfig {
    /// How much longer than SLUICE_PEER_TIMEOUT_MS a node's Lease call to its key's owner may
    /// take: below a parent, the owner waits up to SLUICE_LEASE_PARENT_TIMEOUT_MS for the
    /// parent's grant on a key new to the cluster before it answers.
    pub(crate) fn parent_wait(&self) -> Duration {
        self.parent
            .as_ref()
            .map_or(Duration::ZERO, |p| p.timing.timeout)
    }
}

/// SLUICE_PEER_WRITE_BEHIND: where owners copy their counters, and how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteBehind {
    /// REDIS_URL and friends, validated as for the Redis backend.
    pub redis: RedisConfig,
    /// SLUICE_PEER_WRITE_BEHIND_MS, between 10 ms and 60 s.
    pub interval: Duration,
    /// CACHE_KEY_PREFIX, which every write-behind key starts with.
    pub key_prefix: String,
}
