//! Reservations (issue 51, docs/token-budgets.md): a request reserves its estimated cost when it
//! starts and settles its real cost when it ends, through Envoy's own ratelimit filter.
//!
//! - **Reserve.** A descriptor carrying the entry [`RESERVE`] (from a `generic_key` action; its
//!   value is not read) is charged its hits as usual, the entry left out of matching and of
//!   the counter key. Admitted, the answer's dynamic metadata carries [`RESERVATION`]: a token
//!   naming when the hits were reserved and how many (`<ms since the epoch>.<hits>`), which
//!   Envoy's filter writes into the stream's metadata. Refused, whatever its counters kept of
//!   the reserved hits is given back at once, so a refused request leaves nothing behind, and
//!   no token is given (so the stream-end descriptor, whose `metadata` action finds nothing,
//!   is not sent).
//! - **Settle.** At the stream's end a descriptor carrying [`RESERVATION`] (its value the
//!   token, read from the stream's metadata by a `metadata` action) and the request's real cost
//!   as its hits gives back what the estimate passed the cost to the window (or bucket) that
//!   held it, at the instant the token names: a window that has ended since keeps it, as it
//!   kept the estimate, and the current one is not given what it never held. A cost above the
//!   estimate is charged at the end's instant, never refused. The descriptor is answered OK.
//! - **Never settled.** A token is never refunded unless its settle arrives: a stream whose end
//!   is lost stays charged at its estimate, which is the conservative side.
//! - **What is reserved.** Beside each window counter a reservation charges, its estimate is
//!   counted on the counter's *reserved* twin ([`reserved_twin`]: the key and
//!   `sluice_reserved_`, the same window, no limit) and its settle takes it off there too, in
//!   the same store, so `/debug/counters` shows a tenant's used and reserved hits apart, on
//!   every replica. A bucket has no twin (its hits drain, no window holds them).

use smallvec::SmallVec;

use super::ServiceError;
use super::plan::Plan;
use crate::clock::Timestamp;
use crate::descriptor::Request;
use crate::limiter::{Algorithm, Decision, Quota};
use crate::store::Hit;

/// The entry a descriptor carries to reserve its hits (its value is not read).
pub const RESERVE: &str = "sluice_reserve";

/// The entry a descriptor carries at its request's end to settle a reservation: its value is
/// the token the reserving answer's dynamic metadata gave under the same name, and the
/// descriptor's hits are the request's real cost. Also the dynamic metadata's key.
pub(crate) const RESERVATION: &str = "sluice_reservation";

/// What a descriptor does with its hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    Plain,
    Reserve,
    /// Settles `estimate` hits reserved at `at` with the real `cost`.
    Settle {
        at: Timestamp,
        estimate: u64,
        cost: u64,
    },
}

/// A request with reservation entries: the request without them (a settle descriptor's hits
/// set to 0, a peek: its cost is settled apart), and each descriptor's role.
pub(super) struct Reservations {
    pub(super) request: Request,
    pub(super) roles: SmallVec<[Role; 4]>,
}

impl Reservations {
    /// Whether any descriptor reserves.
    pub(super) fn reserves(&self) -> bool {
        self.roles.contains(&Role::Reserve)
    }
}

/// `request` split into [`Reservations`]; `None` when no descriptor carries a reservation entry
/// (the common case, which costs a look at each entry's key).
pub(super) fn split(request: &Request) -> Result<Option<Reservations>, ServiceError> {
    let marked = |k: &str| k == RESERVE || k == RESERVATION;
    let any = request
        .descriptors
        .iter()
        .any(|d| d.entries.iter().any(|e| marked(&e.key)));
    if !any {
        return Ok(None);
    }
    let mut request = request.clone();
    let request_hits = u64::from(request.hits_addend.max(1));
    let mut roles = SmallVec::new();
    for (index, d) in request.descriptors.iter_mut().enumerate() {
        let mut role = Role::Plain;
        for e in d.entries.iter().filter(|e| marked(&e.key)) {
            role = match (role, e.key.as_str()) {
                (Role::Plain, RESERVE) => Role::Reserve,
                (Role::Plain, _) => {
                    let (at, estimate) = parse(&e.value).ok_or_else(|| bad(index, &e.value))?;
                    let cost = d.hits_addend.unwrap_or(request_hits);
                    Role::Settle { at, estimate, cost }
                }
                _ => return Err(bad(index, "both sluice_reserve and sluice_reservation")),
            };
        }
        d.entries.retain(|e| !marked(&e.key));
        if matches!(role, Role::Settle { .. }) {
            d.hits_addend = Some(0);
            d.negative_hits = false;
        }
        roles.push(role);
    }
    Ok(Some(Reservations { request, roles }))
}

fn bad(index: usize, token: &str) -> ServiceError {
    ServiceError::BadReservation {
        index,
        token: token.chars().take(64).collect(),
    }
}

/// The token of a reservation of `hits` made at `at`.
pub(super) fn token(at: Timestamp, hits: u64) -> String {
    format!("{}.{hits}", at.micros() / 1_000)
}

/// A token's instant and hits.
fn parse(token: &str) -> Option<(Timestamp, u64)> {
    let (ms, hits) = token.split_once('.')?;
    let ms: u64 = ms.parse().ok()?;
    Some((
        Timestamp::from_micros(ms.checked_mul(1_000)?),
        hits.parse().ok()?,
    ))
}

/// The hits a reservation's token names: the fewest any reserving descriptor was charged (they
/// come from one `hits_addend` in practice; with several, a settle gives back no more than the
/// smallest took).
pub(super) fn reserved_hits(r: &Reservations, plans: &[Plan<'_>]) -> u64 {
    plans
        .iter()
        .zip(&r.roles)
        .filter(|(_, role)| **role == Role::Reserve)
        .filter_map(|(plan, _)| match plan {
            Plan::Counted { hits, .. } => Some(*hits),
            _ => None,
        })
        .min()
        .unwrap_or(0)
}

/// Each counted descriptor's role and its hits' range in [`super::plan::hits`]' order.
fn counted<'a>(
    r: &'a Reservations,
    plans: &'a [Plan<'_>],
) -> impl Iterator<Item = (Role, std::ops::Range<usize>)> + 'a {
    let mut at = 0;
    plans.iter().zip(&r.roles).filter_map(move |(plan, role)| {
        let Plan::Counted { limit, .. } = plan else {
            return None;
        };
        let range = at..at + limit.quota_count();
        at = range.end;
        Some((*role, range))
    })
}

/// The settles' hits: what each gives back, at the instant it reserved, and the costs past
/// their estimates, to charge now.
pub(super) fn settlements<'k>(
    r: &Reservations,
    plans: &[Plan<'_>],
    hits: &[Hit<'k>],
) -> (Vec<(Timestamp, Hit<'k>)>, Vec<Hit<'k>>) {
    let (mut back, mut over) = (Vec::new(), Vec::new());
    for (role, range) in counted(r, plans) {
        let Role::Settle { at, estimate, cost } = role else {
            continue;
        };
        for h in &hits[range] {
            match cost.checked_sub(estimate) {
                Some(0) => {}
                Some(more) => over.push(Hit { hits: more, ..*h }),
                None => back.push((
                    at,
                    Hit {
                        hits: estimate - cost,
                        ..*h
                    },
                )),
            }
        }
    }
    (back, over)
}

/// A refused request's reserving descriptors: what their counters kept of the reserved hits
/// (an admitted quota's hits, unless the refusal's own give-back returned them; a refused
/// quota's count moved, as a fixed window counts refused hits), to give back now.
pub(super) fn refused<'k>(
    r: &Reservations,
    plans: &[Plan<'_>],
    hits: &[Hit<'k>],
    decisions: &[Decision],
) -> Vec<Hit<'k>> {
    let mut back = Vec::new();
    for (role, range) in counted(r, plans) {
        if role != Role::Reserve {
            continue;
        }
        let own = &decisions[range.clone()];
        let given_back = own.len() > 1 && own.iter().any(|d| d.over);
        for (h, d) in hits[range].iter().zip(own) {
            let kept = match d.over {
                false if given_back && !h.quota.charges_refused() => 0,
                false => h.hits,
                true => d.count_after.saturating_sub(d.count_before),
            };
            if kept > 0 {
                back.push(Hit { hits: kept, ..*h });
            }
        }
    }
    back
}

/// What a reserved twin's key adds to its counter's: never a Go key, since Go keys end in the
/// window's start.
const TWIN_SUFFIX: &str = "sluice_reserved_";

/// The reserved twin of a window counter (`key`, `quota`): its key, and a quota of the same
/// window that never refuses. `None` for a bucket or a concurrency limit.
pub(super) fn reserved_twin(key: &str, quota: &Quota) -> Option<(String, Quota)> {
    if !matches!(
        quota.algorithm,
        Algorithm::FixedWindow | Algorithm::SlidingWindow
    ) {
        return None;
    }
    let twin = Quota {
        requests_per_unit: u32::MAX,
        algorithm: Algorithm::FixedWindow,
        burst: None,
        charge_refused: true,
        safe_capacity: None,
        ..*quota
    };
    Some((format!("{key}{TWIN_SUFFIX}"), twin))
}

/// The twins' hits of a request's reservations: each admitted reserving counter's hits
/// (`reserved` of them, the token's), and each settling counter's estimate with the instant it
/// was reserved at. Owned keys; [`twin_hits`] borrows them.
pub(super) fn twins(
    r: &Reservations,
    plans: &[Plan<'_>],
    hits: &[Hit<'_>],
    reserved: Option<u64>,
) -> Vec<(Option<Timestamp>, String, Quota, u64)> {
    let mut out = Vec::new();
    for (role, range) in counted(r, plans) {
        let (at, n) = match role {
            Role::Reserve => match reserved {
                Some(n) => (None, n),
                None => continue,
            },
            Role::Settle { at, estimate, .. } => (Some(at), estimate),
            Role::Plain => continue,
        };
        for h in &hits[range] {
            if let Some((key, quota)) = reserved_twin(h.key, &h.quota) {
                out.push((at, key, quota, n));
            }
        }
    }
    out
}

/// [`twins`] as hits.
pub(super) fn twin_hits(twins: &[(Option<Timestamp>, String, Quota, u64)]) -> Vec<Hit<'_>> {
    twins
        .iter()
        .map(|(_, key, quota, hits)| Hit {
            key,
            quota: *quota,
            hits: *hits,
        })
        .collect()
}

/// The request's settles, and how many came after a window that held their estimate had ended
/// (their estimate stays charged there): what the reservation metrics count.
pub(super) fn settled(
    r: &Reservations,
    plans: &[Plan<'_>],
    hits: &[Hit<'_>],
    now: Timestamp,
) -> (u64, u64) {
    let (mut settled, mut late) = (0, 0);
    for (role, range) in counted(r, plans) {
        let Role::Settle { at, .. } = role else {
            continue;
        };
        settled += 1;
        let ended = hits[range].iter().any(|h| {
            reserved_twin(h.key, &h.quota).is_some() && {
                let w = h.quota.window();
                w.index(at.secs()) != w.index(now.secs())
            }
        });
        late += u64::from(ended);
    }
    (settled, late)
}
