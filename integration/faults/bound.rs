//! What a fault scenario may admit per window, written as docs/cluster.md and
//! docs/hardening.md write it, and computed from that text, so the bound a test asserts and
//! the bound the catalogue's table prints are one string: a sum of terms in the limit `L`, the
//! safe capacity `S` and `A`, the most one node holds as its own allowance at equal demand
//! (`L` over the nodes: a lost lease owner's), each with an optional whole or fractional
//! coefficient (`L + S`, `2 L`, `L + 3 S`, `4/3 L`).

use super::harness::{Outcome, Scenario};

/// A scenario's bound: `during` for every window a fault covers, `edge` (when more is allowed
/// there: the formula and the docs' reason) for the windows a fault begins or ends in, and `L`
/// for a window no fault touches.
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    pub during: &'static str,
    pub edge: Option<(&'static str, &'static str)>,
}

/// A bound of `during` in every faulty window.
pub const fn within(during: &'static str) -> Bound {
    Bound { during, edge: None }
}

/// `during`, and `edge` (for `why`) where a fault begins or ends.
pub const fn with_edge(during: &'static str, edge: &'static str, why: &'static str) -> Bound {
    Bound {
        during,
        edge: Some((edge, why)),
    }
}

/// The numbers a formula's letters stand for in scenario `s`.
#[derive(Clone, Copy, Debug)]
struct Letters {
    l: u64,
    s: u64,
    a: u64,
}

impl Letters {
    fn of(s: &Scenario) -> Self {
        let nodes = s.nodes as u64;
        Letters {
            l: s.limit,
            // The default safe capacity: the limit over the nodes (docs/cluster.md).
            s: s.safe_capacity.unwrap_or(s.limit / nodes),
            a: s.limit / nodes,
        }
    }
}

/// `formula`'s value, rounded down; panics on a formula it cannot read (a test's own typo).
fn eval(formula: &str, v: Letters) -> u64 {
    let mut total_num = 0u64;
    for term in formula.split('+') {
        let words: Vec<&str> = term.split_whitespace().collect();
        let (coefficient, letter) = match words.as_slice() {
            [c, l] => (*c, Some(*l)),
            [w] if w.chars().all(|c| c.is_ascii_digit() || c == '/') => (*w, None),
            [l] => ("1", Some(*l)),
            _ => panic!("bound {formula:?}: cannot read the term {term:?}"),
        };
        let (num, den) = match coefficient.split_once('/') {
            Some((n, d)) => (n.parse::<u64>(), d.parse::<u64>()),
            None => (coefficient.parse::<u64>(), Ok(1)),
        };
        let (num, den) = (
            num.unwrap_or_else(|_| panic!("bound {formula:?}: coefficient {coefficient:?}")),
            den.unwrap_or_else(|_| panic!("bound {formula:?}: coefficient {coefficient:?}")),
        );
        let unit = match letter {
            None => 1,
            Some("L") => v.l,
            Some("S") => v.s,
            Some("A") => v.a,
            Some(other) => panic!("bound {formula:?}: unknown letter {other:?}"),
        };
        total_num += num * unit / den;
    }
    total_num
}

impl Bound {
    /// What window `i` (from the run's first, 0) of `s` may admit.
    pub fn for_window(&self, s: &Scenario, i: u64) -> u64 {
        let v = Letters::of(s);
        let (from, to) = (i * s.window_secs, (i + 1) * s.window_secs);
        let run_end = s.run.as_secs();
        let covered = s.faults.iter().any(|f| {
            let end = f.until.map_or(run_end, |u| u.as_secs());
            f.at.as_secs() < to && end >= from
        });
        let edge = s.faults.iter().any(|f| {
            let inside = |t: u64| (from..to).contains(&t);
            inside(f.at.as_secs()) || f.until.is_some_and(|u| inside(u.as_secs()))
        });
        let during = eval(self.during, v);
        match (covered, edge, self.edge) {
            (_, true, Some((e, _))) => during.max(eval(e, v)),
            (true, _, _) => during,
            (false, _, _) => v.l,
        }
    }

    /// The bound as the catalogue's table says it, with its values for `s`.
    pub fn describe(&self, s: &Scenario) -> String {
        let v = Letters::of(s);
        let mut text = format!("{} = {}", self.during, eval(self.during, v));
        if let Some((edge, why)) = self.edge {
            text += &format!(
                "; where a fault begins or ends ({why}): {edge} = {}",
                eval(edge, v)
            );
        }
        text
    }

    /// Every window of `o` within its bound; the windows that passed it, with the report.
    pub fn check(&self, s: &Scenario, o: &Outcome) -> Result<(), String> {
        let over: Vec<String> = o
            .windows
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                let bound = self.for_window(s, i as u64);
                (w.total() > bound).then(|| format!("window {i} admitted {} > {bound}", w.total()))
            })
            .collect();
        match over.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "{} (bound: {}):\n{}",
                over.join(", "),
                self.describe(s),
                o.report(s)
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas_read_as_the_docs_write_them() {
        let v = Letters {
            l: 300,
            s: 100,
            a: 100,
        };
        for (formula, value) in [
            ("L", 300),
            ("L + S", 400),
            ("2 L", 600),
            ("L + 3 S", 600),
            ("4/3 L", 400),
            ("L + S + A", 500),
            ("150 + 150 + 100", 400),
        ] {
            assert_eq!(eval(formula, v), value, "{formula}");
        }
    }
}
