//! TEMPORARY STUB (replaced by the config branch).
use crate::descriptor::Entry;
use crate::limiter::Unit;
use arc_swap::ArcSwapOption;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

pub struct RateLimitConfig {
    pub domains: std::collections::HashMap<String, Domain>,
}
impl RateLimitConfig {
    pub fn empty() -> Self {
        RateLimitConfig {
            domains: Default::default(),
        }
    }
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }
    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }
    pub fn dump(&self) -> String {
        String::new()
    }
}
pub struct Domain {
    pub name: String,
    pub limits: Vec<(Vec<Entry>, Limit)>,
}
impl Domain {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn lookup(&self, entries: &[Entry]) -> Option<Matched<'_>> {
        self.limits
            .iter()
            .find(|(e, _)| e == entries)
            .map(|(_, l)| Matched {
                limit: l,
                shared_values: Vec::new(),
            })
    }
}
pub struct Matched<'a> {
    pub limit: &'a Limit,
    pub shared_values: Vec<(usize, &'a str)>,
}
pub struct Limit {
    pub full_key: String,
    pub rule: Rule,
    pub name: String,
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    pub detailed_metric: bool,
    pub value_to_metric: bool,
    pub metadata: Option<serde_json::Value>,
}
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    Unlimited,
    Limited { requests_per_unit: u32, unit: Unit },
}
#[derive(Default)]
pub struct ConfigStats {
    pub load_success: AtomicU64,
    pub load_error: AtomicU64,
}
#[derive(Clone)]
pub struct ConfigHandle {
    inner: Arc<ArcSwapOption<RateLimitConfig>>,
    stats: Arc<ConfigStats>,
}
impl ConfigHandle {
    pub fn new(initial: Option<RateLimitConfig>) -> Self {
        ConfigHandle {
            inner: Arc::new(ArcSwapOption::from(initial.map(Arc::new))),
            stats: Default::default(),
        }
    }
    pub fn current(&self) -> Option<Arc<RateLimitConfig>> {
        self.inner.load_full()
    }
    pub fn store(&self, cfg: RateLimitConfig) {
        self.inner.store(Some(Arc::new(cfg)))
    }
    pub fn stats(&self) -> &ConfigStats {
        &self.stats
    }
}
#[derive(Clone, Debug)]
pub enum ConfigSource {
    Path(std::path::PathBuf),
    Runtime {
        root: std::path::PathBuf,
        subdirectory: String,
        app_directory: String,
    },
}
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    pub merge_domain_config: bool,
}
pub struct WatchGuard;
pub fn spawn_watcher(
    _s: ConfigSource,
    _o: LoadOptions,
    _h: ConfigHandle,
    _p: std::time::Duration,
) -> WatchGuard {
    WatchGuard
}
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<String>);
pub fn load(_s: &ConfigSource, _o: &LoadOptions) -> Result<RateLimitConfig, ConfigErrors> {
    Ok(RateLimitConfig::empty())
}
