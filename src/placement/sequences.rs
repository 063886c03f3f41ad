//! Sequence affinity: which copy each live sequence runs on.
//!
//! A model with sequence batching keeps each sequence's state in the Triton instance that
//! saw its first request (`sequence_start`); a later request of the sequence sent to another
//! copy is refused ("must specify the START flag on the first request of the sequence") or
//! answered from the wrong state. So placement remembers, per (model, sequence id), the copy
//! that took the sequence's start, and sends every later request of it there, until the
//! request with `sequence_end`, or until the sequence has been idle for the model's
//! `max_sequence_idle_microseconds` (when Triton itself lets it go). A copy holding a live
//! sequence is never evicted or scaled down. A sequence whose copy has gone (unloaded, its
//! backend down or restarted) is answered with `GatewayError::SequenceLost`: it is never
//! restarted elsewhere behind the client's back, since its state went with the copy.
//!
//! Copies are told apart by an id given when they go on the books, so a copy loaded again in
//! the same place after a loss is not taken for the one the sequence started on.

use foldhash::HashMap;
use std::time::Duration;
use tokio::time::Instant;

/// Triton's `max_sequence_idle_microseconds` when a model's config leaves it out.
pub const TRITON_DEFAULT_IDLE: Duration = Duration::from_secs(1);

/// A sequence id as Triton takes it (its correlation id): a number, or a string.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SequenceId {
    /// `"sequence_id": 17`, gRPC `int64_param`/`uint64_param`.
    Number(u64),
    /// `"sequence_id": "abc"`, gRPC `string_param`.
    Text(Box<str>),
}

impl std::fmt::Display for SequenceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Text(text) => write!(f, "'{text}'"),
        }
    }
}

/// What one request says of its sequence: the id and its flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceRef {
    /// The sequence.
    pub id: SequenceId,
    /// `sequence_start`: the first request.
    pub start: bool,
    /// `sequence_end`: the last request.
    pub end: bool,
}

impl SequenceRef {
    /// A sequence id and flags as a request carries them; `None` for no sequence (Triton
    /// takes id 0 and the empty string for "no correlation id").
    pub fn new(id: SequenceId, start: bool, end: bool) -> Option<Self> {
        let none = matches!(&id, SequenceId::Number(0))
            || matches!(&id, SequenceId::Text(t) if t.is_empty());
        (!none).then_some(Self { id, start, end })
    }
}

/// Where a live sequence runs.
#[derive(Clone, Copy, Debug)]
struct Binding {
    backend: usize,
    copy: u64,
    expires: Instant,
}

/// A change to the count of live sequences a copy holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// Backend index.
    pub backend: usize,
    /// The model.
    pub model: String,
    /// The copy's id.
    pub copy: u64,
}

/// Live sequences per model, and what placement knows of each model's sequencing.
#[derive(Debug, Default)]
pub struct Affinity {
    bindings: HashMap<String, HashMap<SequenceId, Binding>>,
    /// Per model: its idle timeout when it has sequence batching, `None` when it has none;
    /// absent while not known (read from the model's config after a load).
    models: HashMap<String, Option<Duration>>,
}

impl Affinity {
    /// `Some(true)` for a model with sequence batching, `Some(false)` without; `None` while
    /// its config has not been read.
    pub fn is_sequence_model(&self, model: &str) -> Option<bool> {
        self.models.get(model).map(Option::is_some)
    }

    /// Records a model's sequencing, from its config: its idle timeout, or `None` for a
    /// model without sequence batching.
    pub fn learn(&mut self, model: &str, idle: Option<Duration>) {
        self.models.insert(model.to_string(), idle);
    }

    fn idle(&self, model: &str) -> Duration {
        self.models
            .get(model)
            .copied()
            .flatten()
            .unwrap_or(TRITON_DEFAULT_IDLE)
    }

    /// The copy (backend, copy id) a live sequence runs on; `None` when it has none (never
    /// started here, ended, or idle past its timeout).
    pub fn bound(&self, model: &str, id: &SequenceId, now: Instant) -> Option<(usize, u64)> {
        let binding = self.bindings.get(model)?.get(id)?;
        (binding.expires > now).then_some((binding.backend, binding.copy))
    }

    /// Records that a request of `sequence` went to copy `copy` on `backend`: a start binds
    /// the sequence there (a sequence bound elsewhere, restarted, moves), an end unbinds
    /// it, any request keeps it alive for another idle timeout. Returns the copies that now
    /// hold one sequence more, and one fewer.
    pub fn record(
        &mut self,
        model: &str,
        sequence: &SequenceRef,
        (backend, copy): (usize, u64),
        now: Instant,
    ) -> (Option<Held>, Option<Held>) {
        let expires = now + self.idle(model);
        let held = |b: &Binding| Held {
            backend: b.backend,
            model: model.to_string(),
            copy: b.copy,
        };
        let live = self.bindings.entry(model.to_string()).or_default();
        let old = live.get(&sequence.id).copied();
        if sequence.end {
            live.remove(&sequence.id);
            if live.is_empty() {
                self.bindings.remove(model);
            }
            return (None, old.map(|b| held(&b)));
        }
        let new = Binding {
            backend,
            copy,
            expires,
        };
        match old {
            Some(b) if (b.backend, b.copy) == (backend, copy) => {
                live.insert(sequence.id.clone(), new);
                (None, None)
            }
            Some(b) if !sequence.start && b.expires > now => {
                // A later request goes where its sequence runs; one sent elsewhere (a client
                // that ignored the gateway) does not move it.
                (None, None)
            }
            other => {
                live.insert(sequence.id.clone(), new);
                (Some(held(&new)), other.map(|b| held(&b)))
            }
        }
    }

    /// Forgets sequences idle past their timeout; returns the copies that hold one fewer.
    pub fn expire(&mut self, now: Instant) -> Vec<Held> {
        let mut released = Vec::new();
        self.bindings.retain(|model, live| {
            live.retain(|_, b| {
                let keep = b.expires > now;
                if !keep {
                    released.push(Held {
                        backend: b.backend,
                        model: model.clone(),
                        copy: b.copy,
                    });
                }
                keep
            });
            !live.is_empty()
        });
        released
    }

    /// Live sequences, for the admin view: per model, how many.
    pub fn live(&self, now: Instant) -> Vec<(String, usize)> {
        let mut live: Vec<(String, usize)> = self
            .bindings
            .iter()
            .map(|(model, l)| {
                (
                    model.clone(),
                    l.values().filter(|b| b.expires > now).count(),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        live.sort();
        live
    }
}

/// A model's sequencing from its config as Triton serves it (`GET /v2/models/m/config`):
/// `Some(None)` without `sequence_batching`, `Some(Some(idle))` with it (its
/// `max_sequence_idle_microseconds`, Triton's default when unset or 0); `None` when the
/// answer is not a config.
pub fn sequencing_of(config: &[u8]) -> Option<Option<Duration>> {
    let config: serde_json::Value = serde_json::from_slice(config).ok()?;
    let Some(batching) = config.as_object()?.get("sequence_batching") else {
        return Some(None);
    };
    // Protobuf's JSON may write a uint64 as a string.
    let idle = batching.get("max_sequence_idle_microseconds");
    let micros = idle
        .and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()))
        .filter(|&us| us > 0);
    Some(Some(
        micros.map_or(TRITON_DEFAULT_IDLE, Duration::from_micros),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(id: u64, start: bool, end: bool) -> SequenceRef {
        SequenceRef::new(SequenceId::Number(id), start, end).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_sequence_binds_at_its_start_and_lets_go_at_its_end_or_when_idle() {
        let now = Instant::now();
        let mut affinity = Affinity::default();
        affinity.learn("m", Some(Duration::from_secs(60)));
        assert_eq!(affinity.is_sequence_model("m"), Some(true));
        assert_eq!(affinity.is_sequence_model("other"), None);
        let (held, released) = affinity.record("m", &seq(7, true, false), (1, 10), now);
        assert_eq!(held.unwrap().backend, 1);
        assert!(released.is_none());
        assert_eq!(
            affinity.bound("m", &SequenceId::Number(7), now),
            Some((1, 10))
        );
        // A middle request keeps it there; one that went elsewhere does not move it.
        let later = now + Duration::from_secs(30);
        assert_eq!(
            affinity.record("m", &seq(7, false, false), (1, 10), later),
            (None, None)
        );
        assert_eq!(
            affinity.record("m", &seq(7, false, false), (0, 3), later),
            (None, None)
        );
        let soon = now + Duration::from_secs(80);
        assert_eq!(
            affinity.bound("m", &SequenceId::Number(7), soon),
            Some((1, 10))
        );
        // The end lets go.
        let (held, released) = affinity.record("m", &seq(7, false, true), (1, 10), soon);
        assert!(held.is_none());
        assert_eq!(released.unwrap().copy, 10);
        assert_eq!(affinity.bound("m", &SequenceId::Number(7), soon), None);
        // Idle past the timeout: gone, and the copy holds one fewer.
        affinity.record("m", &seq(8, true, false), (0, 3), soon);
        let idle = soon + Duration::from_secs(61);
        assert_eq!(affinity.bound("m", &SequenceId::Number(8), idle), None);
        assert_eq!(affinity.expire(idle).len(), 1);
        assert!(affinity.live(idle).is_empty());
        // A restart moves a sequence.
        affinity.record("m", &seq(9, true, false), (0, 3), idle);
        let (held, released) = affinity.record("m", &seq(9, true, false), (1, 10), idle);
        assert_eq!((held.unwrap().backend, released.unwrap().backend), (1, 0));
    }

    #[test]
    fn reads_the_idle_timeout_from_tritons_config() {
        let config =
            br#"{"name":"s","sequence_batching":{"max_sequence_idle_microseconds":60000000}}"#;
        assert_eq!(sequencing_of(config), Some(Some(Duration::from_secs(60))));
        let text = br#"{"sequence_batching":{"max_sequence_idle_microseconds":"2500000"}}"#;
        assert_eq!(sequencing_of(text), Some(Some(Duration::from_millis(2500))));
        let unset = br#"{"sequence_batching":{}}"#;
        assert_eq!(sequencing_of(unset), Some(Some(TRITON_DEFAULT_IDLE)));
        assert_eq!(sequencing_of(br#"{"name":"add_sub"}"#), Some(None));
        assert_eq!(sequencing_of(b"not json"), None);
    }

    #[test]
    fn id_zero_and_the_empty_string_are_no_sequence() {
        assert!(SequenceRef::new(SequenceId::Number(0), true, false).is_none());
        assert!(SequenceRef::new(SequenceId::Text("".into()), true, false).is_none());
        assert!(SequenceRef::new(SequenceId::Text("a".into()), false, false).is_some());
        let mut affinity = Affinity::default();
        affinity.learn("plain", None);
        assert_eq!(affinity.is_sequence_model("plain"), Some(false));
        assert_eq!(affinity.idle("unknown"), TRITON_DEFAULT_IDLE);
    }
}
