//! `sluice explain`'s text for a terminal, from the JSON that
//! [`crate::service::RateLimitService::explain`] makes (`--json` prints that JSON instead).

use serde_json::Value;

/// The explanation as text for a terminal.
pub(crate) fn render(v: &Value) -> String {
    let mut out = String::new();
    let domain = v["domain"].as_str().unwrap_or_default();
    if v["domain_loaded"] == false {
        out.push_str(&format!("domain {domain}: {}\n", text(&v["why"])));
        return out;
    }
    out.push_str(&format!("domain {domain}\n"));
    for d in v["descriptors"].as_array().into_iter().flatten() {
        out.push_str(&descriptor_text(d));
    }
    if let Some(code) = v.get("overall_code") {
        out.push_str(&format!("overall: {}\n", text(code)));
    }
    if let Some(note) = v.get("global_shadow_mode") {
        out.push_str(&format!("({})\n", text(note)));
    }
    out
}

/// One descriptor of the explanation as text.
fn descriptor_text(d: &Value) -> String {
    let mut out = String::new();
    let entries: Vec<&str> = d["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    out.push_str(&format!(
        "descriptor {}: {}\n",
        d["index"],
        entries.join(", ")
    ));
    if let Some(o) = d.get("override") {
        out.push_str(&format!(
            "  request override: {} per {} (fixed window); the config is not consulted\n",
            o["requests_per_unit"],
            text(&o["unit"])
        ));
    }
    for s in d["path"].as_array().into_iter().flatten() {
        match s["matched"].as_str() {
            Some(node) => out.push_str(&format!(
                "  level {}: {} matched `{node}` ({}){}\n",
                s["level"],
                text(&s["entry"]),
                text(&s["how"]),
                s["limit"]
                    .as_str()
                    .map_or(String::new(), |l| format!(", limit {l}"))
            )),
            None => out.push_str(&format!(
                "  level {}: {} matched nothing\n",
                s["level"],
                text(&s["entry"])
            )),
        }
    }
    if let Some(why) = d.get("why") {
        out.push_str(&format!("  no limit: {}\n", text(why)));
    }
    if let Some(l) = d.get("limit") {
        out.push_str(&limit_text(l));
    }
    if let Some(by) = d.get("replaced_by") {
        out.push_str(&format!(
            "  replaced by {by} (`replaces`): answers OK, uncounted\n"
        ));
    }
    for c in d["counters"].as_array().into_iter().flatten() {
        out.push_str(&format!("  counter {}", text(&c["key"])));
        if let Some(count) = c.get("count") {
            out.push_str(&counter_text(c, count, &d["hits"]));
        }
        out.push('\n');
    }
    if let Some(code) = d.get("code") {
        out.push_str(&format!("  answer: {}\n", text(code)));
    }
    out
}

/// A counter's state as read: a concurrency limit's as slots, the others' as a count.
fn counter_text(c: &Value, count: &Value, hits: &Value) -> String {
    let slots = text(&c["algorithm"]) == "concurrency";
    let (what, refused) = if slots {
        (
            format!(
                "{count} slot(s) held, {} free, the oldest frees itself in",
                c["remaining"]
            ),
            "more would be refused",
        )
    } else {
        (
            format!("count {count}, remaining {}, resets in", c["remaining"]),
            "more hit(s) would be refused",
        )
    };
    let refusal = if c["would_refuse"] == true {
        format!(", {hits} {refused}")
    } else {
        String::new()
    };
    format!(": {what} {}s{refusal}", c["reset_after_secs"])
}

fn limit_text(l: &Value) -> String {
    let mut out = format!("  limit {}", text(&l["full_key"]));
    if l["source"] == "runtime" {
        out.push_str(" (runtime)");
    }
    if l["unlimited"] == true {
        out.push_str(": unlimited (always OK, never counted)");
    }
    for flag in ["shadow_mode", "quota_mode"] {
        if l[flag] == true {
            out.push_str(&format!(", {flag}"));
        }
    }
    if let Some(r) = l["replaces"].as_array().filter(|r| !r.is_empty()) {
        out.push_str(&format!(", replaces {}", Value::Array(r.clone())));
    }
    out.push('\n');
    for b in l["blocks"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "    {} per {}{} ({}{}{}){}\n",
            b["requests_per_unit"],
            b["unit_multiplier"]
                .as_u64()
                .filter(|m| *m > 1)
                .map_or(String::new(), |m| format!("{m} ")),
            text(&b["unit"]),
            text(&b["algorithm"]),
            b["burst"]
                .as_u64()
                .map_or(String::new(), |n| format!(", burst {n}")),
            if b["charge_refused"] == true && b["algorithm"] != "fixed_window" {
                ", charge_refused"
            } else {
                ""
            },
            b["name"]
                .as_str()
                .filter(|n| !n.is_empty())
                .map_or(String::new(), |n| format!(" name {n}")),
        ));
    }
    out
}

/// A JSON string as text (anything else as JSON).
fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_limit_says_so() {
        let limit = |source: &str| serde_json::json!({"full_key": "d.tenant_acme", "source": source, "blocks": []});
        assert_eq!(
            limit_text(&limit("runtime")),
            "  limit d.tenant_acme (runtime)\n"
        );
        assert_eq!(limit_text(&limit("config")), "  limit d.tenant_acme\n");
    }

    #[test]
    fn a_concurrency_counter_reads_as_slots() {
        let v = serde_json::json!({
            "domain": "ex",
            "descriptors": [{
                "index": 0, "entries": ["inflight=i"], "hits": 1,
                "counters": [{
                    "key": "ex_inflight_i_", "algorithm": "concurrency", "count": 2,
                    "remaining": 1, "reset_after_secs": 4, "would_refuse": false,
                }],
            }],
        });
        assert!(
            render(&v).contains(
                "counter ex_inflight_i_: 2 slot(s) held, 1 free, the oldest frees itself in 4s\n"
            ),
            "{}",
            render(&v)
        );
    }
}
