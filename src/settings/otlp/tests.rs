//! The OTLP exporter settings (OTEL_EXPORTER_OTLP_*), from flags to the exporter options and
//! the errors naming each variable.

use super::super::tests::{error, parse, settings};
use super::super::*;

#[test]
fn tracing_is_off_by_default_and_defaults_match_go() {
    let s = settings(&[]).unwrap();
    assert_eq!(s.app.telemetry.tracing, None);
    assert_eq!(s.app.telemetry.otlp_metrics, None);
    let t = settings(&["--tracing-enabled"])
        .unwrap()
        .app
        .telemetry
        .tracing
        .unwrap();
    assert_eq!(t.endpoint.protocol, crate::telemetry::otlp::Protocol::Http);
    assert_eq!(t.endpoint.url, "http://localhost:4318/v1/traces");
    assert_eq!(t.endpoint.timeout, Duration::from_secs(10));
    assert_eq!(t.sampling_rate, 1.0);
    assert_eq!(t.resource[0], ("service.name".into(), "RateLimit".into()));
    assert_eq!(t.resource[1].0, "service.instance.id");
    assert_eq!(t.resource[1].1.len(), 36, "a random UUID");
}

#[test]
fn tracing_variables_win_over_otel_ones_which_fill_in() {
    let t = settings(&[
        "--tracing-enabled=true",
        "--tracing-exporter-protocol=grpc",
        "--otel-exporter-otlp-endpoint=127.0.0.1:4317",
        "--otel-exporter-otlp-headers=Authorization=Basic%20eA==, x-tenant = acme",
        "--otel-service-name=otel-name",
        "--otel-resource-attributes=service.namespace=prod,deployment.environment=eu",
        "--tracing-sampling-rate=0.25",
    ])
    .unwrap()
    .app
    .telemetry
    .tracing
    .unwrap();
    assert_eq!(t.endpoint.protocol, crate::telemetry::otlp::Protocol::Grpc);
    // A gRPC endpoint without a scheme is TLS, as OTEL_EXPORTER_OTLP_INSECURE=false says.
    assert_eq!(t.endpoint.url, "https://127.0.0.1:4317");
    assert_eq!(t.endpoint.tls, Some(crate::tls::ClientTls::default()));
    assert_eq!(
        t.endpoint.headers,
        vec![
            ("authorization".to_string(), "Basic eA==".to_string()),
            ("x-tenant".to_string(), "acme".to_string())
        ]
    );
    assert_eq!(t.sampling_rate, 0.25);
    let attr = |k: &str| {
        t.resource
            .iter()
            .find(|(a, _)| a == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(attr("service.name"), Some("otel-name"));
    assert_eq!(attr("service.namespace"), Some("prod"));
    assert_eq!(attr("deployment.environment"), Some("eu"));

    let t = settings(&[
        "--otel-traces-exporter=otlp",
        "--tracing-service-name=mine",
        "--otel-service-name=otel-name",
        "--otel-exporter-otlp-protocol=http/protobuf",
        "--otel-exporter-otlp-endpoint=http://collector:4318/",
        "--otel-traces-sampler=parentbased_traceidratio",
        "--otel-traces-sampler-arg=0.5",
        "--otel-metrics-exporter=otlp",
        "--otel-metric-export-interval=1000",
    ])
    .unwrap()
    .app
    .telemetry;
    let (tracing, metrics) = (t.tracing.unwrap(), t.otlp_metrics.unwrap());
    assert_eq!(tracing.endpoint.url, "http://collector:4318/v1/traces");
    assert_eq!(tracing.sampling_rate, 0.5);
    assert_eq!(tracing.resource[0].1, "mine");
    assert_eq!(metrics.endpoint.url, "http://collector:4318/v1/metrics");
    assert_eq!(metrics.interval, Duration::from_secs(1));

    let t = settings(&["--otel-traces-exporter=otlp", "--otel-sdk-disabled"]).unwrap();
    assert_eq!(t.app.telemetry.tracing, None);
}

#[test]
fn bad_tracing_settings_name_the_variable() {
    for (args, expected) in [
        (
            &["--tracing-sampling-rate=1.5"][..],
            "TRACING_SAMPLING_RATE=1.5",
        ),
        (
            &["--tracing-exporter-protocol=udp"][..],
            "TRACING_EXPORTER_PROTOCOL=udp",
        ),
        (
            &["--otel-exporter-otlp-protocol=http/json"][..],
            "not support it yet",
        ),
        (
            &["--otel-exporter-otlp-headers=novalue"][..],
            "OTEL_EXPORTER_OTLP_HEADERS=novalue",
        ),
        (
            &["--otel-exporter-otlp-headers=a b=c"][..],
            "OTEL_EXPORTER_OTLP_HEADERS=",
        ),
        (
            &["--otel-resource-attributes==x"][..],
            "OTEL_RESOURCE_ATTRIBUTES",
        ),
        (
            &["--otel-traces-sampler=sometimes"][..],
            "OTEL_TRACES_SAMPLER=sometimes",
        ),
        (
            &["--otel-metrics-exporter=prometheus"][..],
            "OTEL_METRICS_EXPORTER=prometheus",
        ),
        (
            &["--otel-exporter-otlp-timeout=0"][..],
            "OTEL_EXPORTER_OTLP_TIMEOUT=0",
        ),
        (
            &[
                "--tracing-enabled",
                "--otel-exporter-otlp-traces-endpoint=ftp://x",
            ][..],
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=ftp://x",
        ),
    ] {
        let err = error(args);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
    // Parse errors (before validation) name the variable too.
    let err = parse(&["--tracing-sampling-rate=lots"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("TRACING_SAMPLING_RATE"), "{err}");
}

/// OTEL_EXPORTER_OTLP_*HEADERS and OTEL_RESOURCE_ATTRIBUTES values go through the one
/// strict percent-decoder: `%+f` (once read as 0x0f) stops start-up naming the variable.
#[test]
fn percent_encoded_values_take_two_hex_digits() {
    let traces = settings(&[
        "--tracing-enabled",
        "--otel-exporter-otlp-headers=x-key=a%20b",
        "--otel-resource-attributes=team=a%2Cb",
    ])
    .unwrap()
    .app
    .telemetry
    .tracing
    .unwrap();
    assert_eq!(
        traces.endpoint.headers,
        [("x-key".to_owned(), "a b".to_owned())]
    );
    assert!(
        traces
            .resource
            .contains(&("team".to_owned(), "a,b".to_owned()))
    );
    let why = "the value is not valid percent-encoded UTF-8 (a % takes two hex digits)";
    for (var, item) in [
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-key=%+f"),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-key=%+f"),
        ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-key=%+f"),
        ("OTEL_RESOURCE_ATTRIBUTES", "team=%+f"),
    ] {
        let flag = format!("--{}={item}", var.to_ascii_lowercase().replace('_', "-"));
        assert_eq!(error(&[&flag]), format!("{var}={item}: {why}"));
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, step by step; to split next"
)]
fn otlp_endpoints_take_tls_from_their_scheme_and_insecure() {
    use crate::telemetry::otlp::Protocol;
    let traces = |args: &[&str]| {
        let mut all = vec!["--tracing-enabled"];
        all.extend_from_slice(args);
        settings(&all)
            .unwrap()
            .app
            .telemetry
            .tracing
            .unwrap()
            .endpoint
    };
    // https: TLS with the system's roots and no client certificate.
    let e = traces(&["--otel-exporter-otlp-endpoint=https://collector:4318"]);
    assert_eq!(e.url, "https://collector:4318/v1/traces");
    assert_eq!(e.tls, Some(crate::tls::ClientTls::default()));
    // http: plain text; TLS files are not read (so not needed) for it.
    let e = traces(&[
        "--otel-exporter-otlp-endpoint=http://collector:4318",
        "--otel-exporter-otlp-certificate=/nonexistent/ca.pem",
    ]);
    assert_eq!(e.url, "http://collector:4318/v1/traces");
    assert_eq!(e.tls, None);
    // No scheme: OTLP/HTTP means http; gRPC means https unless INSECURE, and the signal's
    // own INSECURE wins over the common one. INSECURE never turns an https URL plain.
    assert_eq!(
        traces(&["--otel-exporter-otlp-endpoint=collector:4318"]).url,
        "http://collector:4318/v1/traces"
    );
    let grpc = "--tracing-exporter-protocol=grpc";
    for (args, url) in [
        (
            &[grpc, "--otel-exporter-otlp-endpoint=c:4317"][..],
            "https://c:4317",
        ),
        (
            &[
                grpc,
                "--otel-exporter-otlp-endpoint=c:4317",
                "--otel-exporter-otlp-insecure",
            ][..],
            "http://c:4317",
        ),
        (
            &[
                grpc,
                "--otel-exporter-otlp-endpoint=c:4317",
                "--otel-exporter-otlp-insecure=true",
                "--otel-exporter-otlp-traces-insecure=false",
            ][..],
            "https://c:4317",
        ),
        (
            &[
                grpc,
                "--otel-exporter-otlp-traces-endpoint=c:4317",
                "--otel-exporter-otlp-traces-insecure=true",
            ][..],
            "http://c:4317",
        ),
        (
            &[
                grpc,
                "--otel-exporter-otlp-endpoint=https://c:4317",
                "--otel-exporter-otlp-insecure=true",
            ][..],
            "https://c:4317",
        ),
        // The default endpoint is http://localhost:4317, plain text as before.
        (&[grpc][..], "http://localhost:4317"),
    ] {
        let e = traces(args);
        assert_eq!(e.protocol, Protocol::Grpc);
        assert_eq!(e.url, url, "{args:?}");
        assert_eq!(e.tls.is_some(), url.starts_with("https"), "{args:?}");
    }
    // Metrics read their own INSECURE.
    let m = settings(&[
        "--otel-metrics-exporter=otlp",
        "--otel-exporter-otlp-metrics-protocol=grpc",
        "--otel-exporter-otlp-endpoint=c:4317",
        "--otel-exporter-otlp-metrics-insecure",
    ])
    .unwrap()
    .app
    .telemetry
    .otlp_metrics
    .unwrap();
    assert_eq!(m.endpoint.url, "http://c:4317");
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, step by step; to split next"
)]
fn otlp_tls_files_are_read_per_signal_and_checked_before_start() {
    let pki = test_pki::TestPki::new();
    let leaf = pki.leaf("client", &["localhost"]);
    let other = pki.leaf("other", &["localhost"]);
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let (ca, cert, key) = (path(&pki.ca), path(&leaf.cert), path(&leaf.key));
    let read = |p: &str| std::fs::read(p).unwrap();
    let both = [
        "--tracing-enabled",
        "--otel-metrics-exporter=otlp",
        "--otel-exporter-otlp-endpoint=https://collector:4318",
    ];
    let run = |extra: &[&str]| {
        let args: Vec<&str> = both.iter().chain(extra).copied().collect();
        settings(&args)
    };

    // The common variables serve both signals.
    let t = run(&[
        &format!("--otel-exporter-otlp-certificate={ca}"),
        &format!("--otel-exporter-otlp-client-certificate={cert}"),
        &format!("--otel-exporter-otlp-client-key={key}"),
    ])
    .unwrap()
    .app
    .telemetry;
    let expected = crate::tls::ClientTls {
        ca_pem: Some(read(&ca)),
        identity_pem: Some((read(&cert), read(&key))),
        server_name: None,
    };
    assert_eq!(t.tracing.unwrap().endpoint.tls.as_ref(), Some(&expected));
    assert_eq!(t.otlp_metrics.unwrap().endpoint.tls, Some(expected.clone()));
    // A key never shows in a debug print.
    assert!(!format!("{expected:?}").contains("PRIVATE KEY"));

    // A signal's own variables win, each on its own: the traces' CA and client pair, the
    // metrics' key with the common certificate.
    let (other_cert, other_key) = (path(&other.cert), path(&other.key));
    let t = run(&[
        "--otel-exporter-otlp-certificate=/nonexistent/common-ca.pem",
        &format!("--otel-exporter-otlp-traces-certificate={ca}"),
        &format!("--otel-exporter-otlp-metrics-certificate={ca}"),
        &format!("--otel-exporter-otlp-client-certificate={cert}"),
        &format!("--otel-exporter-otlp-client-key={other_key}"),
        &format!("--otel-exporter-otlp-traces-client-certificate={other_cert}"),
        &format!("--otel-exporter-otlp-metrics-client-key={key}"),
    ])
    .unwrap()
    .app
    .telemetry;
    let tls = t.tracing.unwrap().endpoint.tls.unwrap();
    assert_eq!(tls.ca_pem, Some(read(&ca)));
    assert_eq!(
        tls.identity_pem,
        Some((read(&other_cert), read(&other_key)))
    );
    let tls = t.otlp_metrics.unwrap().endpoint.tls.unwrap();
    assert_eq!(tls.identity_pem, Some((read(&cert), read(&key))));

    // Errors name the variable (the signal's own when it is the one set) and the file.
    let err = |extra: &[&str]| run(extra).unwrap_err().to_string();
    let e = err(&["--otel-exporter-otlp-certificate=/nonexistent/ca.pem"]);
    assert!(
        e.starts_with("OTEL_EXPORTER_OTLP_CERTIFICATE=/nonexistent/ca.pem: cannot read the file: "),
        "{e}"
    );
    let e = err(&["--otel-exporter-otlp-metrics-certificate=/nonexistent/ca.pem"]);
    assert!(
        e.starts_with("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE=/nonexistent/ca.pem: cannot read"),
        "{e}"
    );
    assert_eq!(
        err(&[&format!("--otel-exporter-otlp-certificate={key}")]),
        format!(
            "OTEL_EXPORTER_OTLP_CERTIFICATE={key}: no PEM certificate (BEGIN CERTIFICATE) in the file"
        )
    );
    assert_eq!(
        err(&[&format!("--otel-exporter-otlp-client-certificate={cert}")]),
        format!(
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE={cert}: needs OTEL_EXPORTER_OTLP_CLIENT_KEY, the certificate's private key"
        )
    );
    assert_eq!(
        err(&[&format!(
            "--otel-exporter-otlp-traces-client-certificate={cert}"
        )]),
        format!(
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE={cert}: needs OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY, the certificate's private key"
        )
    );
    assert_eq!(
        err(&[&format!("--otel-exporter-otlp-metrics-client-key={key}")]),
        format!(
            "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY={key}: needs OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE, the certificate of this key"
        )
    );
    assert_eq!(
        err(&[
            &format!("--otel-exporter-otlp-client-certificate={cert}"),
            &format!("--otel-exporter-otlp-client-key={other_key}"),
        ]),
        format!(
            "OTEL_EXPORTER_OTLP_CLIENT_KEY={other_key}: the private key does not match the certificate in OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE={cert}"
        )
    );
    let e = err(&[
        &format!("--otel-exporter-otlp-client-certificate={cert}"),
        "--otel-exporter-otlp-client-key=/nonexistent/key.pem",
    ]);
    assert!(
        e.starts_with("OTEL_EXPORTER_OTLP_CLIENT_KEY=/nonexistent/key.pem: cannot read the file"),
        "{e}"
    );
    // A half pair is refused even with export off; files are only read when used.
    let e = settings(&[&format!("--otel-exporter-otlp-client-key={key}")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("needs OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
        "{e}"
    );
    assert!(settings(&["--otel-exporter-otlp-certificate=/nonexistent/ca.pem"]).is_ok());
    // Bad schemes name their variable.
    let e = error(&["--tracing-enabled", "--otel-exporter-otlp-endpoint=ftp://x"]);
    assert!(
        e.contains("OTEL_EXPORTER_OTLP_ENDPOINT=ftp://x: expected an http:// or https:// URL"),
        "{e}"
    );
}
