//! Sequences on the books: a live sequence is bound to the copy that saw it start, its later
//! requests go there, and while it lives that copy is never evicted or scaled down. Its own
//! file so the bookkeeping of sequences reads apart from placing and evicting copies.

use super::{BackendView, Table};
use crate::error::GatewayError;
use crate::model::ModelRef;
use crate::placement::sequences::{Held, SequenceRef};
use std::time::Duration;
use tokio::time::Instant;

impl Table {
    /// Where a request of a sequence that is not its start must go: `Some(backend)` while
    /// the sequence is live on a copy that is still there, `None` when it is not bound
    /// (never started through this gateway, ended, idle past its timeout: placed as any
    /// request, and Triton judges it), an error when its copy has gone. An end request
    /// for a lost sequence lets the sequence go.
    pub fn route_sequence(
        &mut self,
        model: &ModelRef,
        sequence: &SequenceRef,
        view: &[BackendView],
        now: Instant,
    ) -> Result<Option<usize>, GatewayError> {
        let Some((b, copy)) = self.sequences.bound(&model.name, &sequence.id, now) else {
            return Ok(None);
        };
        let version = model.version_number().ok().flatten();
        let alive = view.get(b).is_some_and(|v| v.ready)
            && self.backends[b]
                .copies
                .get(&model.name)
                .is_some_and(|c| c.id == copy && c.serves(version));
        if alive {
            return Ok(Some(b));
        }
        if sequence.end {
            self.sequences.record(&model.name, sequence, (b, copy), now);
        }
        Err(GatewayError::SequenceLost {
            model: model.name.clone(),
            sequence: sequence.id.to_string(),
        })
    }

    /// Records a request of `sequence` sent to the copy of `model` on backend `b` (by
    /// `serve`, or down a stream already open to it): its start binds the sequence there,
    /// its end lets it go, any request keeps it live for another idle timeout.
    pub fn sequence_sent(&mut self, b: usize, model: &str, sequence: &SequenceRef, now: Instant) {
        let Some(copy) = self.backends[b].copies.get(model).map(|c| c.id) else {
            return;
        };
        let (held, released) = self.sequences.record(model, sequence, (b, copy), now);
        if let Some(held) = held {
            self.count_sequence(&held, true);
        }
        if let Some(released) = released {
            self.count_sequence(&released, false);
        }
    }

    /// Lets go of sequences idle past their model's timeout (Triton has let them go too):
    /// their copies may be evicted again.
    pub fn expire_sequences(&mut self, now: Instant) {
        for released in self.sequences.expire(now) {
            self.count_sequence(&released, false);
        }
    }

    fn count_sequence(&mut self, held: &Held, more: bool) {
        self.backends[held.backend].modify(&held.model, |copy| {
            if copy.id == held.copy {
                copy.sequences = if more {
                    copy.sequences + 1
                } else {
                    copy.sequences.saturating_sub(1)
                };
            }
        });
    }

    /// What placement knows of a model's sequencing (see `Affinity::is_sequence_model`).
    pub fn is_sequence_model(&self, model: &str) -> Option<bool> {
        self.sequences.is_sequence_model(model)
    }

    /// Records a model's sequencing from its config: its idle timeout, or `None` for a
    /// model without sequence batching.
    pub fn learn_sequencing(&mut self, model: &str, idle: Option<Duration>) {
        self.sequences.learn(model, idle);
    }

    /// Live sequences per model, for the admin view.
    pub fn live_sequences(&self, now: Instant) -> Vec<(String, usize)> {
        self.sequences.live(now)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Decision;
    use super::super::tests::{
        MIB, assert_within_capacity, est, load, model, plan_of, policy, view,
    };
    use super::*;

    fn seq(id: u64, start: bool, end: bool) -> SequenceRef {
        SequenceRef::new(
            crate::placement::sequences::SequenceId::Number(id),
            start,
            end,
        )
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_sequence_stays_on_its_copy_which_is_never_evicted_or_scaled_down() {
        let start = Instant::now();
        let mut table = Table::new(&[100 * MIB, 100 * MIB], policy(), start);
        table.learn_sequencing("s", Some(Duration::from_secs(60)));
        load(&mut table, "s", 60, start);
        let plan = table
            .plan_extra_copy("s", &est(60), &view(2), false, start)
            .unwrap();
        table.finish_load(plan.backend, "s", &Ok(()), start);
        let serve = |table: &mut Table, s: &SequenceRef, now| match table.decide_for(
            &model("s"),
            Some(s),
            &est(60),
            &view(2),
            (false, true),
            now,
        ) {
            Decision::Serve(b) => {
                table.release(b, "s", now);
                b
            }
            other => panic!("{other:?}"),
        };
        // Two sequences start, one on each copy (fewest live sequences first); every later
        // request of each goes where it started, whatever the load.
        let a = serve(&mut table, &seq(1, true, false), start);
        let b = serve(&mut table, &seq(2, true, false), start);
        assert_ne!(a, b);
        for _ in 0..3 {
            assert_eq!(serve(&mut table, &seq(1, false, false), start), a);
            assert_eq!(serve(&mut table, &seq(2, false, false), start), b);
        }
        // A copy with a live sequence is neither evicted nor scaled down.
        let later = start + Duration::from_secs(50);
        assert!(
            table
                .take_idle_extra_copies(Duration::ZERO, &|_| 1, later)
                .is_empty()
        );
        assert!(matches!(
            table.decide(&model("big"), &est(60), &view(2), false, true, later),
            Decision::Refuse(GatewayError::NoRoom { .. })
        ));
        // Sequence 2 ends: its copy may go now, and sequence 1's may not.
        assert_eq!(serve(&mut table, &seq(2, false, true), later), b);
        let removed = table.take_idle_extra_copies(Duration::ZERO, &|_| 1, later);
        assert_eq!(removed, [(b, "s".to_string())]);
        // Idle past the model's timeout, sequence 1 lets go of its copy too.
        let idle = later + Duration::from_secs(61);
        table.expire_sequences(idle);
        let evicting = plan_of(table.decide(&model("big"), &est(60), &view(2), false, true, idle));
        assert_eq!(evicting.evict[0].model, "s");
        assert_eq!(evicting.backend, a);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sequence_whose_copy_has_gone_is_refused_not_restarted() {
        let start = Instant::now();
        let mut table = Table::new(&[100 * MIB, 100 * MIB], policy(), start);
        table.learn_sequencing("s", Some(Duration::from_secs(60)));
        let b = load(&mut table, "s", 10, start);
        let decide = |table: &mut Table, s: &SequenceRef| {
            table.decide_for(
                &model("s"),
                Some(s),
                &est(10),
                &view(2),
                (false, true),
                start,
            )
        };
        assert!(matches!(decide(&mut table, &seq(5, true, false)), Decision::Serve(x) if x == b));
        table.release(b, "s", start);
        // The copy goes (lost with its backend, or unloaded); a copy loaded again in its
        // place is another copy.
        assert!(table.copy_gone(b, "s", start));
        load(&mut table, "s", 10, start);
        assert!(matches!(
            decide(&mut table, &seq(5, false, false)),
            Decision::Refuse(GatewayError::SequenceLost { .. })
        ));
        // Its end lets it go; a new start is served.
        assert!(matches!(
            decide(&mut table, &seq(5, false, true)),
            Decision::Refuse(GatewayError::SequenceLost { .. })
        ));
        assert!(matches!(
            decide(&mut table, &seq(5, false, false)),
            Decision::Serve(_)
        ));
        assert!(matches!(
            decide(&mut table, &seq(6, true, false)),
            Decision::Serve(_)
        ));
        assert_within_capacity(&table);
    }
}
