//! The Redis settings and BACKEND_TYPE, from flags to [`RedisConfig`] and the errors naming each
//! variable.

use super::super::tests::{error, parse, serve, settings};
use super::super::*;
use super::*;
use crate::store::redis::Auth;

/// REDIS_AUTH's credentials, as the settings keep them.
fn auth_of(user: Option<&str>, password: &str) -> Option<Auth> {
    Some(Auth {
        username: user.map(str::to_owned),
        password: Secret::new(password),
    })
}

fn redis_error(extra: &[&str]) -> String {
    let mut args = vec!["--backend-type", "redis", "--redis-url", "127.0.0.1:6379"];
    args.extend_from_slice(extra);
    error(&args)
}

#[test]
fn redis_allowances_are_off_by_default_and_their_settings_checked() {
    let base = ["--backend-type", "redis", "--redis-url", "127.0.0.1:6379"];
    assert_eq!(redis_settings(&base).allowance, None);
    let on = redis_settings(&[&base[..], &["--redis-allowance"]].concat());
    assert_eq!(on.allowance, Some(AllowanceTuning::new(100_000, 32 << 20)));
    assert_eq!(
        redis_error(&[
            "--redis-allowance",
            "--stop-cache-key-increment-when-overlimit"
        ]),
        "SLUICE_REDIS_ALLOWANCE=true: cannot be on with \
         STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, whose rule needs every key's count in \
         Redis before a request is decided; turn one of them off"
    );
    for (args, want) in [
        (
            ["--redis-allowance-horizon-ms", "5"],
            "SLUICE_REDIS_ALLOWANCE_HORIZON_MS=5: must be between 10 and 10000",
        ),
        (
            ["--redis-allowance-max-bytes", "1000"],
            "SLUICE_REDIS_ALLOWANCE_MAX_BYTES=1000: must be between 1048576 (1 MiB) and \
             68719476736 (64 GiB)",
        ),
    ] {
        let err = redis_error(&[&["--redis-allowance"][..], &args[..]].concat());
        assert_eq!(err, want);
    }
}

#[test]
fn the_local_cache_max_age_is_a_second_by_default_and_checked() {
    let r = redis_settings(&["--backend-type", "redis", "--redis-url", "127.0.0.1:6379"]);
    assert_eq!(r.local_cache_max_age, Duration::from_secs(1));
    let r = redis_settings(&[
        "--backend-type",
        "redis",
        "--redis-url",
        "127.0.0.1:6379",
        "--local-cache-max-age-ms",
        "300",
    ]);
    assert_eq!(r.local_cache_max_age, Duration::from_millis(300));
    for bad in ["0", "31536000001"] {
        let err = redis_error(&["--local-cache-max-age-ms", bad]);
        assert_eq!(
            err,
            format!(
                "SLUICE_LOCAL_CACHE_MAX_AGE_MS={bad}: must be between 1 and 31536000000 (a year)"
            )
        );
    }
}

#[test]
fn redis_startup_backoff_defaults_parses_and_checks() {
    let r = redis_settings(&["--backend-type", "redis", "--redis-url", "127.0.0.1:6379"]);
    assert_eq!(r.startup, StartupBackoff::default());
    assert_eq!(r.startup.initial, Duration::from_secs(1));
    assert_eq!(r.startup.max, Duration::from_secs(30));
    assert_eq!(r.startup.max_elapsed, None);
    let r = redis_settings(&[
        "--backend-type",
        "redis",
        "--redis-url",
        "127.0.0.1:6379",
        "--redis-startup-initial-interval",
        "100ms",
        "--redis-startup-max-interval",
        "2s",
        "--redis-startup-max-elapsed-time",
        "5m",
    ]);
    assert_eq!(
        r.startup,
        StartupBackoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
            max_elapsed: Some(Duration::from_secs(300)),
        }
    );
    let err = redis_error(&["--redis-startup-initial-interval", "0"]);
    assert!(
        err.starts_with("REDIS_STARTUP_INITIAL_INTERVAL=0: "),
        "{err}"
    );
    let err = redis_error(&["--redis-startup-max-interval", "soon"]);
    assert!(
        err.starts_with("REDIS_STARTUP_MAX_INTERVAL=soon: "),
        "{err}"
    );
    let err = redis_error(&[
        "--redis-startup-initial-interval",
        "10s",
        "--redis-startup-max-interval",
        "1s",
    ]);
    assert!(
        err.starts_with("REDIS_STARTUP_MAX_INTERVAL=1s: ")
            && err.contains("REDIS_STARTUP_INITIAL_INTERVAL=10s"),
        "{err}"
    );
    let err = redis_error(&["--redis-startup-max-elapsed-time", "1"]);
    assert!(
        err.starts_with("REDIS_STARTUP_MAX_ELAPSED_TIME=1: "),
        "{err}"
    );
}

#[test]
fn redis_pool_knobs_are_accepted_and_pool_on_empty_is_wait_only() {
    // Accepted and meaningless: one multiplexed connection per Redis.
    redis_settings(&[
        "--backend-type",
        "redis",
        "--redis-url",
        "127.0.0.1:6379",
        "--redis-persecond-pool-size",
        "50",
        "--redis-persecond-pipeline-window",
        "150us",
        "--redis-persecond-pipeline-limit",
        "8",
        "--redis-cluster-pipeline-parallelism",
        "4",
        "--redis-pool-on-empty-behavior",
        "wait",
        "--redis-persecond-pool-on-empty-behavior",
        "WAIT",
    ]);
    for value in ["CREATE", "ERROR", "error"] {
        let err = redis_error(&["--redis-pool-on-empty-behavior", value]);
        assert!(
            err.starts_with(&format!("REDIS_POOL_ON_EMPTY_BEHAVIOR={value}: "))
                && err.contains("only WAIT"),
            "{err}"
        );
    }
    let err = redis_error(&["--redis-persecond-pool-on-empty-behavior", "BLOCK"]);
    assert!(
        err.starts_with("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR=BLOCK: "),
        "{err}"
    );
    let err = redis_error(&["--redis-persecond-pipeline-window", "fast"]);
    assert!(
        err.starts_with("REDIS_PERSECOND_PIPELINE_WINDOW=fast: "),
        "{err}"
    );
    let err = parse(&["--redis-cluster-pipeline-parallelism", "many"])
        .expect_err("negative")
        .to_string();
    assert!(err.contains("REDIS_CLUSTER_PIPELINE_PARALLELISM"), "{err}");
}

fn redis_settings(args: &[&str]) -> RedisConfig {
    match settings(args).unwrap().app.backend {
        Backend::Redis(r) => *r,
        other => panic!("expected the Redis backend, got {other:?}"),
    }
}

/// Passwords and OTLP header values show neither in the raw flags' debug output nor in the
/// validated settings'.
#[test]
fn secrets_never_show_in_debug_output() {
    let args = [
        "--redis-url",
        "redis://admin:url-s3cr3t@10.0.0.1:6379",
        "--redis-persecond",
        "--redis-persecond-socket-type",
        "tcp",
        "--redis-persecond-url",
        "10.0.0.2:6379",
        "--redis-persecond-auth",
        "u:auth-s3cr3t",
        "--redis-sentinel-auth",
        "sentinel-s3cr3t",
        "--tracing-enabled",
        "--otel-exporter-otlp-headers",
        "authorization=Bearer%20header-s3cr3t",
    ];
    // The raw REDIS_URL is as given (`--help` shows it too): its credentials are the
    // operator's choice; REDIS_AUTH is the variable for secrets.
    let raw = format!("{:?}", serve(&args)).replace("url-s3cr3t", "");
    let validated = format!("{:?}", settings(&args).unwrap());
    for debug in [raw, validated] {
        assert!(!debug.contains("s3cr3t"), "{debug}");
    }
}

#[test]
fn redis_auth_files_are_read_at_start_and_kept_out_of_the_urls() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("auth");
    std::fs::write(&file, "sluice:s3cret\n").unwrap();
    let path = file.to_str().unwrap();
    let r = redis_settings(&[
        "--backend-type",
        "redis",
        "--redis-url",
        "127.0.0.1:6379",
        "--redis-socket-type",
        "tcp",
        "--redis-auth-file",
        path,
    ]);
    assert_eq!(urls(&r.main), ["redis://127.0.0.1:6379"]);
    assert_eq!(r.main.credentials, Credentials::File(file.clone()));
    // Sentinel: the master's file and the sentinels' file each go where REDIS_AUTH and
    // REDIS_SENTINEL_AUTH would.
    let sentinel_file = dir.path().join("sentinel");
    std::fs::write(&sentinel_file, "admin").unwrap();
    let r = redis_settings(&[
        "--backend-type",
        "redis",
        "--redis-type",
        "sentinel",
        "--redis-url",
        "m,10.0.0.1:26379",
        "--redis-auth-file",
        path,
        "--redis-sentinel-auth-file",
        sentinel_file.to_str().unwrap(),
    ]);
    assert_eq!(urls(&r.main), ["redis://10.0.0.1:26379"]);
    assert_eq!(r.main.credentials, Credentials::File(sentinel_file));
    assert_eq!(
        r.main.topology,
        RedisTopology::Sentinel {
            master_name: "m".into(),
            master_auth: None,
            master_credentials: Credentials::File(file.clone()),
        }
    );
    // Errors name the variable and the file.
    let missing = dir.path().join("missing");
    let err = redis_error(&["--redis-auth-file", missing.to_str().unwrap()]);
    assert!(
        err.starts_with(&format!(
            "REDIS_AUTH_FILE={}: cannot open",
            missing.display()
        )),
        "{err}"
    );
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let err = redis_error(&["--redis-auth-file", empty.to_str().unwrap()]);
    assert!(err.ends_with("is empty"), "{err}");
    let err = redis_error(&["--redis-auth", "x", "--redis-auth-file", path]);
    assert!(
        err.ends_with("set REDIS_AUTH or REDIS_AUTH_FILE, not both"),
        "{err}"
    );
    // The per-second Redis has its own.
    let r = redis_settings(&[
        "--backend-type",
        "redis",
        "--redis-url",
        "127.0.0.1:6379",
        "--redis-persecond",
        "--redis-persecond-url",
        "127.0.0.1:6380",
        "--redis-persecond-socket-type",
        "tcp",
        "--redis-persecond-auth-file",
        path,
    ]);
    assert_eq!(r.main.credentials, Credentials::Fixed);
    let ps = r.per_second.unwrap();
    assert_eq!(ps.credentials, Credentials::File(file.clone()));
    assert_eq!(urls(&ps), ["redis://127.0.0.1:6380"]);
}

#[test]
fn redis_sentinel_takes_the_master_name_first_and_separate_credentials() {
    let r = redis_settings(&[
        "--redis-type",
        "SENTINEL",
        "--redis-url",
        "mymaster, 10.0.0.1:26379,sentinel-2:26379",
        "--redis-auth",
        "master-pass",
        "--redis-sentinel-auth",
        "admin:s3nt/nel",
    ]);
    // REDIS_AUTH is the master's, REDIS_SENTINEL_AUTH the sentinels'; the default unix
    // socket type does not apply to sentinels (Go dials them over TCP).
    assert_eq!(
        r.main.topology,
        RedisTopology::Sentinel {
            master_name: "mymaster".into(),
            master_auth: auth_of(None, "master-pass"),
            master_credentials: Credentials::Fixed,
        }
    );
    assert_eq!(
        urls(&r.main),
        [
            "redis://admin:s3nt%2Fnel@10.0.0.1:26379",
            "redis://admin:s3nt%2Fnel@sentinel-2:26379"
        ]
    );
    assert_eq!(r.main.tls, None);

    let err = error(&["--redis-type", "sentinel", "--redis-url", "mymaster"]);
    assert_eq!(
        err,
        "REDIS_URL=mymaster: expected <master name>,<sentinel host:port>,... for REDIS_TYPE=sentinel"
    );
    let err = error(&[
        "--redis-type",
        "sentinel",
        "--redis-url",
        "127.0.0.1:26379,127.0.0.1:26380",
    ]);
    assert!(
        err.ends_with("the first item is the master's name, not an address"),
        "{err}"
    );
    let err = error(&["--redis-type", "sentinel", "--redis-url", "m,nowhere"]);
    assert_eq!(err, "REDIS_URL=nowhere: expected host:port");
    let err = error(&["--redis-url", "x:1", "--redis-type", "replicated"]);
    assert_eq!(
        err,
        "REDIS_TYPE=replicated: expected single, sentinel or cluster"
    );

    // The per-second twins.
    let r = redis_settings(&[
        "--redis-url",
        "/run/redis.sock",
        "--redis-persecond",
        "--redis-persecond-type",
        "sentinel",
        "--redis-persecond-url",
        "fast,127.0.0.1:26379",
        "--redis-persecond-auth",
        "u:p",
        "--redis-persecond-sentinel-auth",
        "sp",
    ]);
    let ps = r.per_second.unwrap();
    assert_eq!(
        ps.topology,
        RedisTopology::Sentinel {
            master_name: "fast".into(),
            master_auth: auth_of(Some("u"), "p"),
            master_credentials: Credentials::Fixed,
        }
    );
    assert_eq!(urls(&ps), ["redis://:sp@127.0.0.1:26379"]);
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, step by step; to split next"
)]
fn redis_tls_reads_and_checks_its_files_before_start() {
    let pki = test_pki::TestPki::new();
    let leaf = pki.leaf("client", &["localhost", "127.0.0.1"]);
    let other = pki.leaf("other", &["localhost"]);
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let (ca, cert, key) = (path(&pki.ca), path(&leaf.cert), path(&leaf.key));
    let tcp = [
        "--redis-socket-type",
        "tcp",
        "--redis-url",
        "127.0.0.1:6380",
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        tcp.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let run = |args: Vec<String>| settings(&args.iter().map(String::as_str).collect::<Vec<_>>());

    let r = match run(with(&[
        "--redis-tls",
        "--redis-tls-cacert",
        &ca,
        "--redis-tls-client-cert",
        &cert,
        "--redis-tls-client-key",
        &key,
        "--redis-tls-skip-hostname-verification",
    ]))
    .unwrap()
    .app
    .backend
    {
        Backend::Redis(r) => r,
        other => panic!("expected the Redis backend, got {other:?}"),
    };
    assert_eq!(urls(&r.main), ["rediss://127.0.0.1:6380"]);
    let tls = r.main.tls.clone().unwrap();
    assert_eq!(tls.ca_pem, Some(std::fs::read(&ca).unwrap()));
    assert_eq!(
        tls.client_pem,
        Some((std::fs::read(&cert).unwrap(), std::fs::read(&key).unwrap()))
    );
    assert!(tls.skip_hostname_verification);
    // The key never shows in a debug print.
    assert!(!format!("{r:?}").contains("PRIVATE KEY"), "{r:?}");

    // TLS alone: the system's roots, no client certificate; redis:// URLs become rediss://.
    let r = redis_settings(&[
        "--redis-tls=true",
        "--redis-url",
        "redis://:pw@10.0.0.1:6380",
    ]);
    assert_eq!(urls(&r.main), ["rediss://:pw@10.0.0.1:6380"]);
    assert_eq!(
        r.main.tls,
        Some(RedisTls {
            ca_pem: None,
            client_pem: None,
            skip_hostname_verification: false
        })
    );
    // Without REDIS_TLS the files are not read, as in Go.
    let r = redis_settings(&[
        "--redis-socket-type",
        "tcp",
        "--redis-url",
        "127.0.0.1:6379",
        "--redis-tls-cacert",
        "/nonexistent/ca.pem",
    ]);
    assert_eq!(r.main.tls, None);
    assert_eq!(urls(&r.main), ["redis://127.0.0.1:6379"]);

    let err = |extra: &[&str]| run(with(extra)).unwrap_err().to_string();
    assert_eq!(
        err(&["--redis-tls", "--redis-tls-client-cert", &cert]),
        format!(
            "REDIS_TLS_CLIENT_CERT={cert}: needs REDIS_TLS_CLIENT_KEY, the certificate's private key"
        )
    );
    assert_eq!(
        err(&["--redis-tls", "--redis-tls-client-key", &key]),
        format!(
            "REDIS_TLS_CLIENT_KEY={key}: needs REDIS_TLS_CLIENT_CERT, the certificate of this key"
        )
    );
    let e = err(&["--redis-tls", "--redis-tls-cacert", "/nonexistent/ca.pem"]);
    assert!(
        e.starts_with("REDIS_TLS_CACERT=/nonexistent/ca.pem: cannot read the file: "),
        "{e}"
    );
    let e = err(&["--redis-tls", "--redis-tls-cacert", &key]);
    assert_eq!(
        e,
        format!("REDIS_TLS_CACERT={key}: no PEM certificate (BEGIN CERTIFICATE) in the file")
    );
    let e = err(&[
        "--redis-tls",
        "--redis-tls-client-cert",
        &cert,
        "--redis-tls-client-key",
        &cert,
    ]);
    assert!(
        e.starts_with(&format!("REDIS_TLS_CLIENT_KEY={cert}: no PEM private key")),
        "{e}"
    );
    let e = err(&[
        "--redis-tls",
        "--redis-tls-client-cert",
        &cert,
        "--redis-tls-client-key",
        &path(&other.key),
    ]);
    assert!(
        e.starts_with(&format!(
            "REDIS_TLS_CLIENT_KEY={}: the private key does not match the certificate in REDIS_TLS_CLIENT_CERT={cert}",
            path(&other.key)
        )),
        "{e}"
    );
    // Redis serves TLS on TCP only.
    let e = error(&["--redis-tls", "--redis-url", "/run/redis.sock"]);
    assert!(
        e.contains("needs a TCP address (REDIS_SOCKET_TYPE=tcp)"),
        "{e}"
    );
    let e = error(&["--redis-url", "rediss://10.0.0.1:6380"]);
    assert_eq!(
        e,
        "REDIS_URL=rediss://10.0.0.1:6380: a rediss:// URL needs REDIS_TLS=true (and its REDIS_TLS_* files)"
    );

    // REDIS_PERSECOND_TLS: the same files, for the per-second Redis only.
    let r = redis_settings(&[
        "--redis-socket-type",
        "tcp",
        "--redis-url",
        "127.0.0.1:6379",
        "--redis-persecond",
        "--redis-persecond-socket-type",
        "tcp",
        "--redis-persecond-url",
        "127.0.0.1:6380",
        "--redis-persecond-tls",
        "--redis-tls-cacert",
        &ca,
    ]);
    assert_eq!(r.main.tls, None);
    let ps = r.per_second.unwrap();
    assert_eq!(urls(&ps), ["rediss://127.0.0.1:6380"]);
    assert_eq!(ps.tls.unwrap().ca_pem, Some(std::fs::read(&ca).unwrap()));
}

#[test]
fn backend_defaults_to_memory_and_to_redis_over_a_redis_url() {
    assert_eq!(settings(&[]).unwrap().app.backend, Backend::Memory);
    assert_eq!(
        settings(&["--backend-type", "memory", "--redis-url", "redis:6379"])
            .unwrap()
            .app
            .backend,
        Backend::Memory
    );
    // REDIS_URL alone means Redis, with the Go service's defaults (a unix socket).
    let Backend::Redis(r) = settings(&["--redis-url", "/run/redis.sock"])
        .unwrap()
        .app
        .backend
    else {
        panic!("expected the Redis backend");
    };
    assert_eq!(
        urls(&r.main),
        vec!["redis+unix:///run/redis.sock".to_string()]
    );
    assert_eq!(r.timeout, Duration::from_millis(500));
    assert_eq!(r.expiration_jitter_max_seconds, 300);
    let Backend::Redis(r) = settings(&[
        "--backend-type",
        "redis",
        "--redis-socket-type",
        "tcp",
        "--redis-url",
        "127.0.0.1:6379",
        "--redis-auth",
        "user:p@ss",
        "--redis-timeout",
        "250ms",
    ])
    .unwrap()
    .app
    .backend
    else {
        panic!("expected the Redis backend");
    };
    assert_eq!(
        urls(&r.main),
        vec!["redis://user:p%40ss@127.0.0.1:6379".to_string()]
    );
    assert_eq!(r.timeout, Duration::from_millis(250));
    let err = error(&["--backend-type", "redis"]);
    assert!(err.starts_with("REDIS_URL=: required"), "{err}");
    let err = error(&["--redis-url", "x:1", "--redis-type", "sentinel"]);
    assert!(
        err.starts_with("REDIS_URL=x:1: expected <master name>,<sentinel host:port>"),
        "{err}"
    );
    let err = error(&["--redis-url", "x:1", "--redis-timeout", "soon"]);
    assert!(err.starts_with("REDIS_TIMEOUT=soon"), "{err}");
    let err = error(&["--redis-url", "a:1,b:2", "--redis-socket-type", "tcp"]);
    assert!(err.contains("REDIS_TYPE=cluster"), "{err}");
    // A cluster's seeds are TCP addresses whatever REDIS_SOCKET_TYPE says, as in Go.
    let Backend::Redis(r) = settings(&["--redis-url", "a:1,b:2", "--redis-type", "cluster"])
        .unwrap()
        .app
        .backend
    else {
        panic!("expected the Redis backend");
    };
    assert_eq!(urls(&r.main), ["redis://a:1", "redis://b:2"]);
    assert_eq!(r.main.topology, RedisTopology::Cluster);
    assert_eq!(
        error(&["--backend-type", "etcd"]),
        "BACKEND_TYPE=etcd: unknown backend; expected memory, redis or memcache"
    );
    assert!(error(&["--backend-failure", "maybe"]).starts_with("SLUICE_BACKEND_FAILURE=maybe"));
}
