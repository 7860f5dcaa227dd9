//! `sluice explain`: what Sluice decides for a request, and why. The request comes from the
//! flags (the `/forward-auth` query form) or a `/json` body in a file; the explanation from a
//! running Sluice's `/debug/explain` ([`fetch`]) or from a config file, decoded and explained
//! here as the service would ([`offline`]); [`super::render`] prints it as text.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use serde_json::Value;

use super::http::{self, Client, Limits};
use crate::admin::explain::{Asked, decode};
use crate::clock::SystemClock;
use crate::config::{self, ConfigHandle, ConfigSource, FileLimits, LoadOptions};
use crate::service::{RateLimitService, ServiceOptions};
use crate::store::MemoryStore;

/// The most bytes of a `--request` file (or standard input) read.
const MAX_REQUEST_FILE_BYTES: u64 = 8 << 20;

/// The request to explain, as the flags give it.
pub enum Requested {
    /// `--domain`, `--descriptor` (each `k=v&k2=v2`), `--hits-addend`.
    Flags {
        domain: String,
        descriptors: Vec<String>,
        hits_addend: u32,
    },
    /// `--request PATH`: a `/json` body; `-` is standard input.
    File(PathBuf),
}

/// What to explain against.
pub enum Against {
    /// `--debug-address HOST:PORT`: a running Sluice, counters included.
    Running(String),
    /// `--config PATH`, with the serve settings' options (or why they are invalid, reported
    /// only once the request has been read, as it always has been).
    Config(PathBuf, Result<Box<Offline>, String>),
}

/// What explaining against a config file takes from the serve settings, so the config loads
/// and the request decodes as they would in the service.
pub struct Offline {
    pub load: LoadOptions,
    pub files: FileLimits,
    /// SLUICE_MAX_REQUEST_BYTES.
    pub max_request_bytes: usize,
    pub service: ServiceOptions,
}

/// `sluice explain`: prints the explanation (as JSON with `json`, else as text) and exits 0,
/// or prints why there is none and exits 1.
pub fn run(requested: Requested, against: Against, json: bool) -> ExitCode {
    let asked = match requested {
        Requested::File(path) => read_request(&path).map(Asked::Json),
        Requested::Flags {
            domain,
            descriptors,
            hits_addend,
        } => Ok(Asked::Query(query(&domain, &descriptors, hits_addend))),
    };
    let answer = asked.and_then(|asked| match against {
        Against::Running(addr) => fetch(&addr, &asked, http::LIMITS),
        Against::Config(path, options) => offline(path, &asked, *options?),
    });
    match answer {
        Ok(v) if json => println!("{v}"),
        Ok(v) => print!("{}", super::render::render(&v)),
        Err(e) => {
            eprintln!("sluice explain: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// The query string of `/debug/explain` (the `/forward-auth` query form) for `domain`,
/// `descriptors` (each `k=v&k2=v2`) and `hits_addend`.
pub fn query(domain: &str, descriptors: &[String], hits_addend: u32) -> String {
    let mut q = format!("domain={}", encode(domain));
    for d in descriptors {
        q.push_str("&descriptor=");
        q.push_str(&encode(d));
    }
    if hits_addend > 0 {
        q.push_str(&format!("&hits_addend={hits_addend}"));
    }
    q
}

/// Percent-encodes all but unreserved characters and `=` (which the query form splits a
/// descriptor's entries on, after decoding `%26` back to `&`).
fn encode(text: &str) -> String {
    crate::percent::encode(text, b"=")
}

/// `/debug/explain` from the debug port at `addr` (a GET with the query, or a POST of the
/// JSON), within `limits`; the answer's JSON, or what went wrong.
pub fn fetch(addr: &str, asked: &Asked, limits: Limits) -> Result<Value, String> {
    let mut client = Client::new(addr, limits)?;
    let answer = http::block_on(async {
        match asked {
            Asked::Query(q) => client.get(&format!("/debug/explain?{q}")).await,
            Asked::Json(json) => client.post_json("/debug/explain", json).await,
        }
    })?;
    if answer.status != 200 {
        return Err(format!(
            "{addr} answered {}: {}",
            answer.status,
            answer.body.trim()
        ));
    }
    serde_json::from_str(&answer.body).map_err(|e| format!("{addr} answered no JSON: {e}"))
}

/// `--request PATH`: the file's JSON (`-`: standard input), at most 8 MiB.
fn read_request(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let mut text = String::new();
    let read = if path.as_os_str() == "-" {
        std::io::stdin()
            .take(MAX_REQUEST_FILE_BYTES)
            .read_to_string(&mut text)
    } else {
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_REQUEST_FILE_BYTES).read_to_string(&mut text))
    };
    read.map(|_| text)
        .map_err(|e| format!("--request {}: {e}", path.display()))
}

/// `--config PATH`: the request `asked` explained against the config at `path` (loaded as the
/// service loads it, with the serve settings' key prefix and caps); no counters are read.
pub fn offline(path: PathBuf, asked: &Asked, options: Offline) -> Result<Value, String> {
    let source = ConfigSource::Path(path);
    let loaded = config::load(&source, &options.load, &options.files).map_err(|errors| {
        errors
            .0
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    let request = decode(asked, options.max_request_bytes).map_err(|e| e.to_string())?;
    let service = RateLimitService::new(
        ConfigHandle::new(Some(loaded)),
        Arc::new(MemoryStore::new(1)),
        Arc::new(SystemClock),
        options.service,
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| e.to_string())?;
    runtime
        .block_on(service.explain(&request, false))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
