//! Choosing where a load goes and what it evicts: room without eviction first, else the
//! backend whose victims (read off the front of the eviction order) are least valuable, and
//! the churn guard when only recently used copies would make room. Its own file so the
//! eviction rules read in one place, apart from booking the load they make room for.

use super::{BackendView, Books, CopyEntry, CopyState, Evicted, Idle, Table};
use crate::error::GatewayError;
use crate::placement::located::Located;
use crate::placement::policy::Rank;
use tokio::time::Instant;

impl Table {
    /// The ready backends, taking new copies, that could hold `bytes` once every copy there
    /// that is in use or loading has gone idle: where waiting for room may help.
    pub fn could_hold(&self, bytes: u64, view: &[BackendView]) -> Vec<usize> {
        (self.backends.iter().zip(view).enumerate())
            .filter(|(_, (books, v))| {
                v.ready && v.knows && !books.draining && books.usable >= bytes
            })
            .map(|(b, _)| b)
            .collect()
    }

    /// Ranks, on each of `backends`, the idle copies past `min_churn_age`: what eviction
    /// may take is then `Idle::ranked` (a step every cold miss takes before `choose`).
    pub(super) fn rank_idle(&mut self, backends: &[usize], now: Instant) {
        let Some(before) = now.checked_sub(self.policy.min_churn_age) else {
            return;
        };
        for &b in backends {
            self.backends[b].rank_idle(&self.order, before);
        }
    }

    /// Picks the backend: room without eviction first (most free, then fewest in flight);
    /// else the one whose victims are least recently used. `size(b)` is what the load needs
    /// on backend `b`; copies of `model` itself are never victims.
    pub(super) fn choose(
        &self,
        allowed: &[usize],
        model: &str,
        size: &dyn Fn(usize) -> u64,
        view: &[BackendView],
        allow_evict: bool,
        now: Instant,
    ) -> Result<(usize, Vec<String>, Option<Rank>), GatewayError> {
        let roomy = allowed
            .iter()
            .copied()
            .filter(|&b| self.backends[b].free() >= size(b))
            .max_by_key(|&b| {
                (
                    self.backends[b].free(),
                    std::cmp::Reverse(view[b].in_flight),
                )
            });
        if let Some(b) = roomy {
            return Ok((b, Vec::new(), None));
        }
        let model_too_big = || GatewayError::NoRoom {
            reason: format!(
                "'{model}' needs {} bytes and no backend can free that much (models in use, loading or pinned stay)",
                allowed.iter().map(|&b| size(b)).min().unwrap_or(0)
            ),
        };
        if !allow_evict {
            return Err(model_too_big());
        }
        // (most valuable victim, free space, in flight): the least valuable wins. Under LRU the
        // most valuable victim is the most recently used one.
        let mut best: Option<(usize, Vec<String>, Rank)> = None;
        for &b in allowed {
            let books = &self.backends[b];
            let Some((victims, top)) = victims(books, size(b), model) else {
                continue;
            };
            let better = match &best {
                None => true,
                Some((other, _, other_top)) => {
                    (top, std::cmp::Reverse(books.free()), view[b].in_flight)
                        < (
                            *other_top,
                            std::cmp::Reverse(self.backends[*other].free()),
                            view[*other].in_flight,
                        )
                }
            };
            if better {
                best = Some((b, victims, top));
            }
        }
        match best {
            Some((backend, victims, top)) => Ok((backend, victims, Some(top))),
            None => Err(self
                .churn(allowed, model, size, now)
                .unwrap_or_else(model_too_big)),
        }
    }

    /// Why no backend among `allowed` can make room from its ranked copies, when it is the
    /// churn guard: copies used within `min_churn_age` would make room. The retry is when
    /// the first backend's would all be old enough.
    fn churn(
        &self,
        allowed: &[usize],
        model: &str,
        size: &dyn Fn(usize) -> u64,
        now: Instant,
    ) -> Option<GatewayError> {
        let min_age = self.policy.min_churn_age;
        let retry = allowed
            .iter()
            .filter_map(|&b| {
                let books = &self.backends[b];
                let own = books.copies.get(model).filter(|c| Idle::evictable(c));
                let own_ranked = own.filter(|c| c.rank.is_some()).map_or(0, |c| c.size);
                let own_cooling = own.filter(|c| c.rank.is_none()).map_or(0, |c| c.size);
                let mut room = books.free() + books.idle.ranked_bytes - own_ranked;
                if room + books.idle.cooling_bytes - own_cooling < size(b) {
                    return None;
                }
                let cooling = books.idle.cooling.iter().filter(|(_, n)| &**n != model);
                for (last_used, name) in cooling {
                    room += books.copies[&**name].size;
                    if room >= size(b) {
                        let idle = now.saturating_duration_since(*last_used);
                        return Some(min_age.saturating_sub(idle));
                    }
                }
                None
            })
            .min()?;
        Some(GatewayError::Churn { retry_after: retry })
    }
}

/// The first ranked copies in the eviction order (never one of `model`) whose removal frees
/// `size`, and the rank of the last of them; `None` if even all of them would not do. An
/// ensemble is taken with the parts only it holds here: the group leaves together.
fn victims(books: &Books, size: u64, model: &str) -> Option<(Vec<String>, Rank)> {
    let mut free = books.free();
    let mut chosen = Vec::new();
    let mut top = None;
    for (rank, name) in books
        .idle
        .ranked
        .iter()
        .filter(|(_, name)| &**name != model)
    {
        if free >= size {
            break;
        }
        let copy = &books.copies[&**name];
        free += copy.size;
        chosen.push(name.to_string());
        for part in leaving_with(books, copy, model) {
            free += books.copies[part].size;
            chosen.push(part.to_string());
        }
        top = Some(*rank);
    }
    (free >= size).then(|| (chosen, top.expect("at least one victim")))
}

/// The parts of an ensemble copy that leave with it: those it alone holds, idle otherwise
/// (never `model`, the one being placed).
fn leaving_with<'b>(
    books: &'b Books,
    ensemble: &'b CopyEntry,
    model: &'b str,
) -> impl Iterator<Item = &'b str> {
    ensemble
        .parts
        .iter()
        .map(String::as_str)
        .filter(move |part| {
            *part != model
                && books.copies.get(*part).is_some_and(|c| {
                    c.held == 1
                        && matches!(c.state, CopyState::Ready)
                        && c.in_flight == 0
                        && c.sequences == 0
                        && !c.remote_busy
                        && !c.pinned
                })
        })
}

/// Takes the chosen victims off a backend's books, for the unloads: they depart.
pub(super) fn take_victims(
    books: &mut Books,
    (located, at): (&mut Located, usize),
    victims: Vec<String>,
    now: Instant,
) -> Vec<Evicted> {
    victims
        .into_iter()
        .filter_map(|name| {
            let copy = books.depart(&name, (&mut *located, at), now)?;
            Some(Evicted {
                model: name,
                idle: now.saturating_duration_since(copy.last_used),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::super::*;

    #[tokio::test(start_paused = true)]
    async fn fills_free_space_first_then_evicts_least_recently_used() {
        let start = Instant::now();
        let mut table = Table::new(&[100 * MIB, 100 * MIB], policy(), start);
        // Spread by most free space.
        let a = load(&mut table, "a", 60, start);
        let b = load(&mut table, "b", 60, start + Duration::from_secs(1));
        assert_ne!(a, b);
        // c fits nowhere: the backend with the least recently used model gives it up.
        let later = start + Duration::from_secs(600);
        match table.decide(&model("c"), &est(60), &view(2), false, true, later) {
            Decision::Load(plan) => {
                assert_eq!(plan.backend, a);
                assert_eq!(plan.evict.len(), 1);
                assert_eq!(plan.evict[0].model, "a");
                assert_eq!(plan.evict[0].idle, Duration::from_secs(600));
            }
            other => panic!("{other:?}"),
        }
        assert_within_capacity(&table);
    }

    #[tokio::test(start_paused = true)]
    async fn in_flight_pinned_and_loading_copies_are_never_evicted() {
        let start = Instant::now();
        let mut table = Table::new(&[100 * MIB], policy(), start);
        load(&mut table, "busy", 50, start);
        assert!(matches!(
            table.decide(&model("busy"), &est(50), &view(1), false, true, start),
            Decision::Serve(0)
        ));
        match table.decide(&model("pinned"), &est(50), &view(1), true, true, start) {
            Decision::Load(plan) => table.finish_load(0, &plan.model, &Ok(()), start),
            other => panic!("{other:?}"),
        }
        let later = start + Duration::from_secs(3600);
        let refused = table.decide(&model("new"), &est(10), &view(1), false, true, later);
        assert!(
            matches!(refused, Decision::Refuse(GatewayError::NoRoom { .. })),
            "{refused:?}"
        );
        // Once the busy request is done, busy is the victim.
        table.release(0, "busy", later);
        let much_later = later + Duration::from_secs(3600);
        match table.decide(&model("new"), &est(10), &view(1), false, true, much_later) {
            Decision::Load(plan) => assert_eq!(plan.evict[0].model, "busy"),
            other => panic!("{other:?}"),
        }
        assert_within_capacity(&table);
    }

    #[tokio::test(start_paused = true)]
    async fn churn_guard_refuses_to_evict_recently_used_models() {
        let start = Instant::now();
        let mut table = Table::new(&[100 * MIB], policy(), start);
        load(&mut table, "a", 80, start);
        let soon = start + Duration::from_secs(20);
        match table.decide(&model("b"), &est(80), &view(1), false, true, soon) {
            Decision::Refuse(GatewayError::Churn { retry_after }) => {
                assert_eq!(retry_after, Duration::from_secs(40))
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn preloads_never_evict() {
        let start = Instant::now();
        let mut table = Table::new(&[100 * MIB], policy(), start);
        load(&mut table, "a", 80, start);
        let later = start + Duration::from_secs(3600);
        let refused = table.decide(&model("pre"), &est(50), &view(1), false, false, later);
        assert!(
            matches!(refused, Decision::Refuse(GatewayError::NoRoom { .. })),
            "{refused:?}"
        );
    }
}
