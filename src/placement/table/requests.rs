//! A request's use of a copy: a warm hit takes the copy serving its version with the fewest
//! requests in flight (or the copy its sequence is bound to), and lets go of it when done.
//! Its own file so the warm path reads apart from planning loads.

use super::{BackendView, CopyState, Decision, Table};
use crate::model::ModelRef;
use crate::placement::sequences::SequenceRef;
use tokio::time::Instant;

impl Table {
    /// The decision when a copy of `model` is on the books: `Serve` the copy serving the
    /// version asked for with the fewest requests in flight (counting this one), else `Wait`
    /// for a load of the model that is running; `None` when there is neither. `decide` starts
    /// with this; asking it alone first lets a warm request skip what only a load needs (the
    /// size estimate).
    pub fn hit(&mut self, model: &ModelRef, view: &[BackendView]) -> Option<Decision> {
        self.hit_for(model, None, view, Instant::now())
    }

    /// `hit` for a request that may belong to a sequence: a later request of a live
    /// sequence is served by the copy that saw it start, or refused when that copy has gone
    /// (`GatewayError::SequenceLost`); a sequence's start goes to the copy with the fewest
    /// live sequences, then requests in flight, and binds the sequence there.
    pub fn hit_for(
        &mut self,
        model: &ModelRef,
        sequence: Option<&SequenceRef>,
        view: &[BackendView],
        now: Instant,
    ) -> Option<Decision> {
        // A version that is no number is refused by `decide`.
        let version = model.version_number().ok()?;
        if let Some(sequence) = sequence.filter(|s| !s.start) {
            match self.route_sequence(model, sequence, view, now) {
                Ok(Some(b)) => return Some(self.serve(b, model, version, Some(sequence), now)),
                Ok(None) => {}
                Err(lost) => return Some(Decision::Refuse(lost)),
            }
        }
        let starting = sequence.is_some_and(|s| s.start);
        let mut best: Option<(usize, (usize, usize))> = None;
        let mut loading = None;
        for b in self.located.of(&model.name) {
            if !view[b].ready {
                continue;
            }
            let copy = &self.backends[b].copies[&model.name];
            // This gateway's own requests, plus what waits there that it did not send.
            let load = (
                if starting { copy.sequences } else { 0 },
                copy.in_flight + view[b].queued,
            );
            if copy.serves(version) && best.is_none_or(|(_, n)| load < n) {
                best = Some((b, load));
            }
            match &copy.state {
                CopyState::Loading(rx) => loading = Some(rx.clone()),
                CopyState::Reloading(reload) => loading = Some(reload.waiting.clone()),
                CopyState::Ready => {}
            }
        }
        if let Some((b, _)) = best {
            return Some(self.serve(b, model, version, sequence, now));
        }
        loading.map(Decision::Wait)
    }

    /// Serves a request on the copy of `model` on backend `b` (which serves its version):
    /// one more in flight, and the request's sequence recorded there.
    fn serve(
        &mut self,
        b: usize,
        model: &ModelRef,
        version: Option<u64>,
        sequence: Option<&SequenceRef>,
        now: Instant,
    ) -> Decision {
        self.order.record(&model.name);
        self.backends[b].modify(&model.name, |copy| {
            copy.in_flight += 1;
            copy.served += 1;
            if let Some(v) = version {
                match copy.in_flight_versions.iter_mut().find(|(w, _)| *w == v) {
                    Some((_, n)) => *n += 1,
                    None => copy.in_flight_versions.push((v, 1)),
                }
            }
        });
        if let Some(sequence) = sequence {
            self.sequence_sent(b, &model.name, sequence, now);
        }
        Decision::Serve(b)
    }

    /// Each copy of `model` on the books (loading ones included): its backend, and this
    /// gateway's requests in flight on it.
    pub fn in_flight_per_copy<'a>(
        &'a self,
        model: &'a str,
    ) -> impl Iterator<Item = (usize, usize)> + 'a {
        (self.located.of(model)).map(move |b| (b, self.backends[b].copies[model].in_flight))
    }

    /// A request is done with its copy.
    pub fn release(&mut self, backend: usize, model: &str, now: Instant) {
        self.release_version(backend, model, None, now);
    }

    /// A request that asked for `version` (`None`: the default policy) is done with its copy.
    pub fn release_version(
        &mut self,
        backend: usize,
        model: &str,
        version: Option<u64>,
        now: Instant,
    ) {
        self.backends[backend].modify(model, |copy| {
            copy.in_flight = copy.in_flight.saturating_sub(1);
            copy.last_used = now;
            copy.used_here = Some(now);
            if let Some(v) = version {
                copy.in_flight_versions.retain_mut(|(w, n)| {
                    if *w == v {
                        *n -= 1;
                    }
                    *n > 0
                });
            }
        });
    }
}
