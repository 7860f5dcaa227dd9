//! A real `redis-server` for end-to-end tests: a child process on a 127.0.0.1 port with
//! persistence off, killed on drop. A missing `redis-server` (or one built without TLS, for the
//! TLS tests) fails the test under the test command and CI, and is a recorded skip elsewhere
//! (`process::missing`).

#![allow(
    clippy::disallowed_methods,
    reason = "tests time real processes, sockets and deadlines; Sluice's code reads time through crate::clock"
)]
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_test_support::process::{missing, tool_available};

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    /// What `redis-cli` needs to reach it: TLS files, a password.
    pub cli_flags: Vec<String>,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Finds `redis-server`, or [`missing`] says what to install.
pub fn redis_server_available() -> bool {
    tool_available(
        "redis-server",
        "--version",
        "apt-get install redis-server (scripts/test.sh does)",
    )
}

/// `redis-server` built with TLS (Debian's is): it knows `tls-port`, so without certificates it
/// fails to configure TLS rather than rejecting the directive.
pub fn redis_tls_available() -> bool {
    if !redis_server_available() {
        return false;
    }
    let out = Command::new("redis-server")
        .args(["--port", "0", "--tls-port", "1"])
        .output()
        .expect("run redis-server");
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    (said.contains("TLS") && !said.contains("Bad directive"))
        || missing(
            "a redis-server built with TLS",
            &format!(
                "this one is built without it ({}); Debian's redis-server has it (BUILD_TLS=yes)",
                said.lines().last().unwrap_or_default()
            ),
        )
}

impl RedisServer {
    /// A redis-server on 127.0.0.1:`port`, persistence off, answering PING (bounded wait).
    pub fn start_on(port: u16) -> RedisServer {
        RedisServer::spawn(port, None, &[])
    }

    /// A redis-server on 127.0.0.1:`port`, persistence off, run in `dir` with `extra` flags.
    pub fn spawn(port: u16, dir: Option<&Path>, extra: &[&str]) -> RedisServer {
        RedisServer::launch(&[], port, dir, extra, Vec::new())
    }

    /// `redis-server` (with `config`, a file, first when given) on 127.0.0.1:`port`; `cli_flags`
    /// are what redis-cli needs to reach it (TLS, a password).
    pub fn launch(
        config: &[&str],
        port: u16,
        dir: Option<&Path>,
        extra: &[&str],
        cli_flags: Vec<String>,
    ) -> RedisServer {
        let mut cmd = Command::new("redis-server");
        if let Some(dir) = dir {
            cmd.current_dir(dir);
        }
        let child = cmd
            .args(config)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let r = RedisServer {
            child: Some(child),
            port,
            cli_flags,
        };
        r.wait_ready();
        r
    }

    /// Kills the server now (a crash, for the failure tests); dropping it later is harmless.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the server with SIGSTOP: its port still accepts connections (the kernel queues
    /// them) but nothing answers, as with a hung or partitioned host.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes a paused server (SIGCONT); it answers what was queued.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self
            .child
            .as_ref()
            .expect("server running")
            .id()
            .to_string();
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// One `redis-cli` command; its output, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.cli_flags)
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn wait_ready(&self) {
        let start = Instant::now();
        while self.cli(&["PING"]) != "PONG" {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
