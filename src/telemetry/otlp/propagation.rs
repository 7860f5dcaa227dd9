//! Incoming trace context: W3C `traceparent` (with `tracestate` carried along) and Zipkin B3,
//! in its single-header (`b3`) and multi-header (`x-b3-*`) forms, as the Go service's
//! propagators read them. `api` hands the request's headers (gRPC metadata or HTTP headers)
//! to [`extract`] through a lookup closure, so nothing here knows a protocol type.
//!
//! A malformed header is ignored (the request starts a new trace), as the OpenTelemetry
//! propagators do: a caller's bad header must never fail a rate-limit decision.

/// A remote parent: the caller's trace and span, and whether the caller sampled it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
    /// W3C `tracestate`, passed on unchanged; empty for B3.
    pub trace_state: String,
}

/// Where a `ShouldRateLimit` call came in, for the span's attributes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over gRPC.
    #[default]
    Grpc,
    /// `/json` on PORT.
    Json,
    /// `/nginx` on PORT.
    Nginx,
    /// `/forward-auth` on PORT.
    ForwardAuth,
    /// HAProxy's SPOE, on SPOA_PORT.
    Spoa,
}

/// What `api` knows about a call's tracing: the transport, and the caller's context if any.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestTrace {
    pub transport: Transport,
    pub parent: Option<SpanContext>,
}

/// The header names [`extract`] reads, lower case (gRPC metadata and `http` keys are).
pub(crate) const TRACEPARENT: &str = "traceparent";
pub(crate) const TRACESTATE: &str = "tracestate";
pub(crate) const B3: &str = "b3";
pub(crate) const B3_TRACE_ID: &str = "x-b3-traceid";
pub(crate) const B3_SPAN_ID: &str = "x-b3-spanid";
pub(crate) const B3_SAMPLED: &str = "x-b3-sampled";
pub(crate) const B3_FLAGS: &str = "x-b3-flags";

/// The caller's context from its headers: `traceparent` first, then `b3`, then `x-b3-*`.
/// `header` returns a header's value by lower-case name.
pub(crate) fn extract<'h>(header: impl Fn(&str) -> Option<&'h str>) -> Option<SpanContext> {
    if let Some(mut ctx) = header(TRACEPARENT).and_then(parse_traceparent) {
        if let Some(state) = header(TRACESTATE) {
            // A tracestate is at most 32 members of at most 256 bytes; cap what is carried.
            if state.len() <= 512 {
                ctx.trace_state = state.trim().to_owned();
            }
        }
        return Some(ctx);
    }
    if let Some(ctx) = header(B3).and_then(parse_b3_single) {
        return Some(ctx);
    }
    parse_b3_multi(
        header(B3_TRACE_ID)?,
        header(B3_SPAN_ID)?,
        header(B3_SAMPLED),
        header(B3_FLAGS),
    )
}

fn hex_nibble(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// Lower-case hex into `out`, exactly `2 * out.len()` digits.
fn hex_into(s: &[u8], out: &mut [u8]) -> Option<()> {
    if s.len() != out.len() * 2 {
        return None;
    }
    for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
        *o = hex_nibble(pair[0])? << 4 | hex_nibble(pair[1])?;
    }
    Some(())
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// `version-traceid-parentid-flags`, W3C Trace Context level 1. Version `ff` and all-zero ids
/// are invalid; a future version may append fields after the flags, which are ignored.
pub(crate) fn parse_traceparent(value: &str) -> Option<SpanContext> {
    let v = value.trim().as_bytes();
    if v.len() < 55 {
        return None;
    }
    let mut version = [0u8; 1];
    hex_into(&v[0..2], &mut version)?;
    if version[0] == 0xff || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    if version[0] == 0 && v.len() != 55 {
        return None;
    }
    if version[0] != 0 && v.len() > 55 && v[55] != b'-' {
        return None;
    }
    let mut trace_id = [0u8; 16];
    let mut span_id = [0u8; 8];
    let mut flags = [0u8; 1];
    hex_into(&v[3..35], &mut trace_id)?;
    hex_into(&v[36..52], &mut span_id)?;
    hex_into(&v[53..55], &mut flags)?;
    valid(trace_id, span_id, flags[0] & 1 == 1)
}

fn valid(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> Option<SpanContext> {
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(SpanContext {
        trace_id,
        span_id,
        sampled,
        trace_state: String::new(),
    })
}

/// A B3 trace id is 32 or 16 hex digits; a 64-bit one is left-padded with zeros.
fn b3_trace_id(s: &str) -> Option<[u8; 16]> {
    let mut id = [0u8; 16];
    match s.len() {
        32 => hex_into(s.as_bytes(), &mut id)?,
        16 => hex_into(s.as_bytes(), &mut id[8..])?,
        _ => return None,
    }
    Some(id)
}

fn b3_span_id(s: &str) -> Option<[u8; 8]> {
    let mut id = [0u8; 8];
    hex_into(s.as_bytes(), &mut id)?;
    Some(id)
}

/// `b3: {TraceId}-{SpanId}[-{SamplingState}[-{ParentSpanId}]]`. A lone sampling state (`0`,
/// `1`, `d`) carries no parent and is ignored. No sampling state means deferred: sampled here,
/// as OpenTelemetry's B3 propagator does.
pub(crate) fn parse_b3_single(value: &str) -> Option<SpanContext> {
    let mut parts = value.trim().split('-');
    let trace_id = b3_trace_id(parts.next()?)?;
    let span_id = b3_span_id(parts.next()?)?;
    let sampled = match parts.next() {
        None => true,
        Some("1") | Some("d") => true,
        Some("0") => false,
        Some(_) => return None,
    };
    if let Some(parent) = parts.next() {
        b3_span_id(parent)?;
    }
    if parts.next().is_some() {
        return None;
    }
    valid(trace_id, span_id, sampled)
}

/// `x-b3-traceid`, `x-b3-spanid`, `x-b3-sampled` (`1`/`0`, or `true`/`false` from old
/// clients) and `x-b3-flags: 1` (debug, which implies sampled).
pub(crate) fn parse_b3_multi(
    trace_id: &str,
    span_id: &str,
    sampled: Option<&str>,
    flags: Option<&str>,
) -> Option<SpanContext> {
    let trace_id = b3_trace_id(trace_id.trim())?;
    let span_id = b3_span_id(span_id.trim())?;
    let debug = flags.map(str::trim) == Some("1");
    let sampled = match sampled.map(str::trim) {
        _ if debug => true,
        None => true,
        Some("1") | Some("true") => true,
        Some("0") | Some("false") => false,
        Some(_) => return None,
    };
    valid(trace_id, span_id, sampled)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_parses_and_rejects_what_w3c_rejects() {
        let c = parse_traceparent(TP).unwrap();
        assert_eq!(hex(&c.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&c.span_id), "00f067aa0ba902b7");
        assert!(c.sampled);
        let c = parse_traceparent(&TP.replace("-01", "-00")).unwrap();
        assert!(!c.sampled);
        // Other flag bits do not mean sampled.
        assert!(
            !parse_traceparent(&TP.replace("-01", "-02"))
                .unwrap()
                .sampled
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473é-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
        // A later version may add fields.
        let future = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what";
        assert!(parse_traceparent(future).is_some());
    }

    #[test]
    fn b3_single_and_multi() {
        let c =
            parse_b3_single("80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90")
                .unwrap();
        assert_eq!(hex(&c.trace_id), "80f198ee56343ba864fe8b2a57d3eff7");
        assert_eq!(hex(&c.span_id), "e457b5a2e4d86bd1");
        assert!(c.sampled);
        let c = parse_b3_single("64fe8b2a57d3eff7-e457b5a2e4d86bd1-0").unwrap();
        assert_eq!(hex(&c.trace_id), "000000000000000064fe8b2a57d3eff7");
        assert!(!c.sampled);
        assert!(
            parse_b3_single("64fe8b2a57d3eff7-e457b5a2e4d86bd1")
                .unwrap()
                .sampled
        );
        for bad in [
            "0",
            "1",
            "d",
            "xyz-e457b5a2e4d86bd1",
            "64fe8b2a57d3eff7-e457b5a2e4d86bd1-2",
        ] {
            assert_eq!(parse_b3_single(bad), None, "{bad}");
        }

        let c = parse_b3_multi(
            "80f198ee56343ba864fe8b2a57d3eff7",
            "e457b5a2e4d86bd1",
            Some("0"),
            None,
        )
        .unwrap();
        assert!(!c.sampled);
        let c = parse_b3_multi(
            "80f198ee56343ba864fe8b2a57d3eff7",
            "e457b5a2e4d86bd1",
            Some("0"),
            Some("1"),
        )
        .unwrap();
        assert!(c.sampled, "debug implies sampled");
        assert!(
            parse_b3_multi(
                "80f198ee56343ba864fe8b2a57d3eff7",
                "e457b5a2e4d86bd1",
                Some("yes"),
                None
            )
            .is_none()
        );
    }

    #[test]
    fn extract_prefers_traceparent_and_carries_tracestate() {
        let headers = [
            (TRACEPARENT, TP),
            (TRACESTATE, "congo=t61rcWkgMzE"),
            (B3, "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1"),
        ];
        let get = |name: &str| headers.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        let c = extract(get).unwrap();
        assert_eq!(hex(&c.span_id), "00f067aa0ba902b7");
        assert_eq!(c.trace_state, "congo=t61rcWkgMzE");

        // A bad traceparent falls through to B3.
        let headers = [
            (TRACEPARENT, "garbage"),
            (B3_TRACE_ID, "80f198ee56343ba864fe8b2a57d3eff7"),
            (B3_SPAN_ID, "e457b5a2e4d86bd1"),
        ];
        let get = |name: &str| headers.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        let c = extract(get).unwrap();
        assert_eq!(hex(&c.span_id), "e457b5a2e4d86bd1");
        assert!(c.sampled);
        assert_eq!(extract(|_| None), None);
    }
}
