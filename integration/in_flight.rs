//! The scenario every refunds test plays: requests in flight counted as Envoy counts them with
//! `is_negative_hits` (a hit at a request's start, the same descriptor as a refund at its end),
//! on a limit of 3 per hour, through any client (gRPC, `/json`, a cluster's nodes in turn).
#![allow(dead_code)]

/// One call's answer: the descriptor's code was OK, and its `limit_remaining`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub ok: bool,
    pub remaining: u32,
}

/// A client of one counter: `call(negative, hits)` sends the descriptor with `hits` as its
/// `hits_addend`, a refund when `negative`.
pub trait Client {
    fn call(&mut self, negative: bool, hits: u64) -> Answer;
}

impl<F: FnMut(bool, u64) -> Answer> Client for F {
    fn call(&mut self, negative: bool, hits: u64) -> Answer {
        self(negative, hits)
    }
}

fn hit(c: &mut impl Client) -> bool {
    c.call(false, 1).ok
}

fn refund(c: &mut impl Client, hits: u64) -> Answer {
    let a = c.call(true, hits);
    assert!(a.ok, "a refund is always answered OK");
    a
}

/// On a limit that counts refused hits (a fixed window, or `charge_refused: true`): 3 hits OK,
/// the 4th OVER and counted; its refund (Envoy sends one for a refused request too) is OK and
/// leaves 3, an admitted request's refund frees a place, and the next hit is OK. Then a refund
/// of 5 on a count of 2 leaves 0, never a credit: 3 hits fit and the 4th is over.
pub fn counted(c: &mut impl Client) {
    let starts: Vec<bool> = (0..4).map(|_| hit(c)).collect();
    assert_eq!(starts, [true, true, true, false]);
    assert_eq!(
        refund(c, 1).remaining,
        0,
        "the refused 4th's refund: 3 left"
    );
    assert_eq!(
        refund(c, 1).remaining,
        1,
        "an admitted request ends: 2 left"
    );
    assert!(hit(c), "a place was free");
    assert!(!hit(c), "and only one");
    assert_eq!(refund(c, 1).remaining, 0, "that refusal's refund: 3 again");
    assert_eq!(refund(c, 1).remaining, 1, "one ends: 2 in flight");
    assert_eq!(
        refund(c, 5).remaining,
        3,
        "5 off a count of 2: floored at 0"
    );
    let starts: Vec<bool> = (0..4).map(|_| hit(c)).collect();
    assert_eq!(starts, [true, true, true, false], "no credit below 0");
}

/// On a limit that does not count refused hits, with the refund applied (for a proxy that sends
/// refunds only for admitted requests, or SLUICE_NEGATIVE_HITS=always): 3 hits OK, the 4th
/// OVER, a refund of 1 OK, and the next hit OK; a refund of 5 on a count of 2 leaves 0.
pub fn applied_without_refused_hits(c: &mut impl Client) {
    let starts: Vec<bool> = (0..4).map(|_| hit(c)).collect();
    assert_eq!(starts, [true, true, true, false]);
    assert_eq!(refund(c, 1).remaining, 1);
    assert!(hit(c));
    assert!(!hit(c));
    assert_eq!(refund(c, 1).remaining, 1);
    assert_eq!(refund(c, 5).remaining, 3);
    let starts: Vec<bool> = (0..4).map(|_| hit(c)).collect();
    assert_eq!(starts, [true, true, true, false]);
}

/// On a limit that does not count refused hits, by default: a refund is answered OK and takes
/// nothing off (it could be a refused request's), so the limit stays full.
pub fn ignored(c: &mut impl Client) {
    let starts: Vec<bool> = (0..4).map(|_| hit(c)).collect();
    assert_eq!(starts, [true, true, true, false]);
    assert_eq!(refund(c, 1).remaining, 0);
    assert!(!hit(c));
}
