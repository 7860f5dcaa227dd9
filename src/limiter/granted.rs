//! A window's hits granted by a remote authority and decided from locally, with the next
//! window's granted ahead: the core the lease client (its key's owner grants), the lease parent
//! link (the parent cluster grants) and Redis allowances (Redis grants, by reservation) share.
//! Each samples the demand it sees ([`super::demand`]), asks for more before what it holds runs
//! out ([`Granted::low`]), and asks for the next window's hits once its window ends within the
//! horizon a grant takes to arrive ([`ahead_due`]), so a new window starts with hits in hand.
//!
//! What each adds is its own: how a grant is applied (a lease grant is the most a holder may
//! use, and only raises what it holds within its window; a Redis reservation adds to the
//! batch), and what a holder keeps beside per window (`X`: Redis's count and whether the
//! window is spent, for allowances).

/// What was granted of one window, what is used of it, and the next window's grant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Granted<X = ()> {
    /// The window (its index) the grant is for; 0 for a lease of a bucket.
    pub window: u64,
    /// Hits granted for `window` (a lease of a bucket: its share, in ppm).
    pub granted: u64,
    /// Hits used of them.
    pub used: u64,
    /// What the holder keeps beside about `window`.
    pub seen: X,
    /// The next window's grant, granted ahead: its hits and what is kept beside them.
    pub ahead: Option<(u64, X)>,
}

/// The window a [`Granted::roll`] left, when it was the one just before the new one: the hits
/// it held unused, and what was kept beside them (for calls stamped in it that come late).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ended<X> {
    pub left: u64,
    pub seen: X,
}

impl<X: Copy + Default> Granted<X> {
    /// Nothing granted yet for `window`.
    pub(crate) fn new(window: u64) -> Self {
        Granted {
            window,
            ..Granted::default()
        }
    }

    /// The hits granted and not used.
    pub(crate) fn left(&self) -> u64 {
        self.granted.saturating_sub(self.used)
    }

    /// Uses `hits` of the grant when they fit in what is left.
    pub(crate) fn take(&mut self, hits: u64) -> bool {
        let fits = self.used.saturating_add(hits) <= self.granted;
        if fits {
            self.used += hits;
        }
        fits
    }

    /// Moves on to `window` (never back): the grant made ahead for it, if it is the next
    /// window, else nothing granted. `None` when `window` is not later; else the window left
    /// when it was the one just before (nothing carries over a gap).
    pub(crate) fn roll(&mut self, window: u64) -> Option<Ended<X>> {
        if window <= self.window {
            return None;
        }
        let next = window == self.window + 1;
        let ended = match next {
            true => Ended {
                left: self.left(),
                seen: self.seen,
            },
            false => Ended::default(),
        };
        let (granted, seen) = match next {
            true => self.ahead.take().unwrap_or_default(),
            false => (0, X::default()),
        };
        *self = Granted {
            window,
            granted,
            used: 0,
            seen,
            ahead: None,
        };
        Some(ended)
    }

    /// Moves on to `window` only when it is the next one and its grant came ahead (the parent
    /// link, which tells "nothing granted for the window" from "granted 0": a window not
    /// granted ahead keeps the old grant, which [`Granted::for_window`] answers none for).
    pub(crate) fn advance(&mut self, window: u64) -> bool {
        if window != self.window + 1 || self.ahead.is_none() {
            return false;
        }
        self.roll(window);
        true
    }

    /// What is granted for `window` and for the one after it: this grant's and the one made
    /// ahead; for the next window, the one made ahead and none after; else none.
    pub(crate) fn for_window(&self, window: u64) -> (Option<u64>, Option<u64>) {
        let ahead = self.ahead.map(|(hits, _)| hits);
        if window == self.window {
            (Some(self.granted), ahead)
        } else if window == self.window + 1 {
            (ahead, None)
        } else {
            (None, None)
        }
    }

    /// Whether what is left covers less than half of `need` (the demand until a grant asked
    /// for now can arrive): time to ask for more, before it runs out.
    pub(crate) fn low(&self, need: u64) -> bool {
        self.left().saturating_mul(2) < need
    }
}

/// Whether the next window's grant is due: the window ends within `horizon_us` (how long a
/// grant takes to arrive, with the holder's next ask), `until_end_us` from now.
pub(crate) fn ahead_due(until_end_us: u64, horizon_us: u64) -> bool {
    until_end_us <= horizon_us
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    struct Count(u64);

    #[test]
    fn hits_are_taken_while_they_fit_in_what_was_granted() {
        let mut g = Granted::<()>::new(7);
        assert!(!g.take(1), "nothing granted yet");
        g.granted = 5;
        assert!(g.take(3));
        assert!(!g.take(3), "2 left");
        assert!(g.take(2));
        assert_eq!((g.left(), g.used), (0, 5));
        assert!(g.take(0));
        // A grant lowered below what was used leaves nothing, never an underflow.
        g.granted = 4;
        assert_eq!(g.left(), 0);
    }

    #[test]
    fn a_roll_to_the_next_window_takes_the_grant_made_ahead_and_reports_the_one_left() {
        let mut g = Granted {
            window: 3,
            granted: 10,
            used: 4,
            seen: Count(90),
            ahead: Some((20, Count(15))),
        };
        assert_eq!(g.roll(3), None, "same window");
        assert_eq!(g.roll(2), None, "never back");
        let ended = g.roll(4).expect("moved");
        assert_eq!(
            ended,
            Ended {
                left: 6,
                seen: Count(90)
            }
        );
        assert_eq!(
            g,
            Granted {
                window: 4,
                granted: 20,
                used: 0,
                seen: Count(15),
                ahead: None
            }
        );
        // A window skipped: nothing granted, nothing carried over.
        assert_eq!(g.roll(6), Some(Ended::default()));
        assert_eq!((g.window, g.granted, g.seen), (6, 0, Count(0)));
    }

    #[test]
    fn a_roll_without_a_grant_ahead_starts_the_window_with_nothing() {
        let mut g = Granted::<()> {
            window: 1,
            granted: 10,
            used: 10,
            ..Granted::default()
        };
        assert_eq!(g.roll(2).map(|e| e.left), Some(0));
        assert_eq!((g.granted, g.used), (0, 0));
    }

    #[test]
    fn an_advance_moves_only_onto_a_window_granted_ahead() {
        let mut g = Granted::<()> {
            window: 5,
            granted: 8,
            ahead: Some((12, ())),
            ..Granted::default()
        };
        assert_eq!(g.for_window(5), (Some(8), Some(12)));
        assert_eq!(g.for_window(6), (Some(12), None));
        assert_eq!(g.for_window(7), (None, None));
        assert_eq!(g.for_window(4), (None, None));
        assert!(!g.advance(7), "not the next window");
        assert!(g.advance(6));
        assert_eq!((g.window, g.granted, g.ahead), (6, 12, None));
        // Nothing granted ahead: the old grant stays, and says nothing of the next window.
        assert!(!g.advance(7));
        assert_eq!(g.window, 6);
        assert_eq!(g.for_window(7), (None, None));
    }

    #[test]
    fn low_is_less_than_half_the_need_left() {
        let g = Granted::<()> {
            granted: 10,
            used: 6,
            ..Granted::default()
        };
        assert!(!g.low(8), "4 left covers half of 8");
        assert!(g.low(9));
        assert!(!g.low(0));
    }

    #[test]
    fn the_next_window_is_due_once_the_window_ends_within_the_horizon() {
        assert!(ahead_due(400, 400));
        assert!(ahead_due(0, 400));
        assert!(!ahead_due(401, 400));
    }
}
