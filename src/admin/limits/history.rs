//! The audit log of runtime limit changes: each logged (target `sluice::audit`) and the last
//! ones kept for `GET /limits/_history`, at most SLUICE_RUNTIME_HISTORY of them.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use serde_json::{Value, json};

/// One change: when, by whom, what, and the limit before and after (`None`: none).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Record {
    pub(crate) time: String,
    pub(crate) who: String,
    pub(crate) op: Op,
    pub(crate) domain: String,
    /// The descriptor path as the API's URL writes it (`tenant=acme/path=%2Fx`).
    pub(crate) path: String,
    pub(crate) old: Option<Value>,
    pub(crate) new: Option<Value>,
}

/// What a change did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Put,
    Delete,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Delete => "delete",
        }
    }
}

impl Record {
    pub(crate) fn json(&self) -> Value {
        json!({
            "time": self.time,
            "who": self.who,
            "op": self.op.name(),
            "domain": self.domain,
            "path": self.path,
            "old": self.old,
            "new": self.new,
        })
    }
}

/// The last changes, oldest first.
#[derive(Debug)]
pub(crate) struct History {
    records: Mutex<VecDeque<Record>>,
    max: usize,
}

/// SLUICE_RUNTIME_HISTORY's default: the changes `/limits/_history` keeps.
pub(crate) const DEFAULT_HISTORY: usize = 1_000;

impl History {
    pub(crate) fn new(max: usize) -> Self {
        History {
            records: Mutex::new(VecDeque::with_capacity(max.min(DEFAULT_HISTORY))),
            max,
        }
    }

    /// Logs `record` and keeps it, forgetting the oldest past the maximum.
    pub(crate) fn record(&self, record: Record) {
        let text = |v: &Option<Value>| v.as_ref().map_or("none".to_owned(), |v| v.to_string());
        let (old, new) = (text(&record.old), text(&record.new));
        tracing::info!(
            target: "sluice::audit",
            who = %record.who,
            op = record.op.name(),
            domain = %record.domain,
            path = %record.path,
            old = %old,
            new = %new,
            "runtime limit changed"
        );
        if self.max == 0 {
            return;
        }
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        if records.len() == self.max {
            records.pop_front();
        }
        records.push_back(record);
    }

    /// The changes kept, oldest first.
    pub(crate) fn json(&self) -> Value {
        let records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        Value::Array(records.iter().map(Record::json).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n: u32) -> Record {
        Record {
            time: "2026-11-27T07:00:00.000Z".to_owned(),
            who: "ops".to_owned(),
            op: Op::Put,
            domain: "d".to_owned(),
            path: format!("tenant=t{n}"),
            old: None,
            new: Some(json!({"unit": "minute", "requests_per_unit": n})),
        }
    }

    #[test]
    fn the_history_keeps_the_last_changes_oldest_first() {
        let h = History::new(2);
        for n in 1..=3 {
            h.record(record(n));
        }
        let paths: Vec<Value> = h
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["path"].clone())
            .collect();
        assert_eq!(paths, [json!("tenant=t2"), json!("tenant=t3")]);
        let none = History::new(0);
        none.record(record(1));
        assert_eq!(none.json(), json!([]));
    }
}
