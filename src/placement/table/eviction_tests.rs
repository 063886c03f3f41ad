//! Every `placement.policy` under the table's rules: each picks its own victim, and none of
//! them breaks the capacity invariant, evicts a copy in use, loading or pinned, or evicts a
//! copy used within `min_churn_age`.

use super::tests::{
    MIB, assert_within_capacity, depart_victims, est, load, model, plan_of, policy, view,
};
use super::*;
use crate::placement::ModelWeight;

const POLICIES: [EvictionPolicy; 4] = [
    EvictionPolicy::Lru,
    EvictionPolicy::Lfu,
    EvictionPolicy::Gdsf,
    EvictionPolicy::Tinylfu,
];

fn table(eviction: EvictionPolicy, usable_mib: &[u64], now: Instant) -> Table {
    let usable: Vec<u64> = usable_mib.iter().map(|mib| mib * MIB).collect();
    Table::new(&usable, policy(), now).with_order(EvictionOrder::new(eviction, now))
}

/// `uses` requests for a loaded model, each done at `at`.
fn serve(table: &mut Table, name: &str, uses: usize, at: Instant) {
    for _ in 0..uses {
        let backends = table.backends.len();
        match table.decide(&model(name), &est(1), &view(backends), false, true, at) {
            Decision::Serve(b) => table.release(b, name, at),
            other => panic!("expected a hit on {name}, got {other:?}"),
        }
    }
}

/// A request for a loaded model that is still running.
fn serve_and_hold(table: &mut Table, name: &str, at: Instant) {
    let backends = table.backends.len();
    let decision = table.decide(&model(name), &est(1), &view(backends), false, true, at);
    assert!(matches!(decision, Decision::Serve(_)), "{decision:?}");
}

fn victims_of(plan: &LoadPlan) -> Vec<&str> {
    plan.evict.iter().map(|e| e.model.as_str()).collect()
}

/// One backend with room for 100 MiB: `a` (20 MiB, 10 uses, used first), `b` (20 MiB, one
/// use), `c` (50 MiB, two uses, used last); a 20 MiB model needs one of them to go.
/// LRU takes the one used longest ago (a), LFU the one used least (b), GDSF the one whose
/// uses are worth least per byte of reload (c: 2 × 0.55 s / 50 MiB against b's
/// 1 × 0.52 s / 20 MiB). TinyLFU weighs the same way, by its sketch's count (here the
/// same as the uses) and size to the power 1.15: c too.
#[tokio::test(start_paused = true)]
async fn each_policy_takes_its_own_victim() {
    for (eviction, victim) in POLICIES.into_iter().zip(["a", "b", "c", "c"]) {
        let start = Instant::now();
        let mut table = table(eviction, &[100], start);
        load(&mut table, "a", 20, start);
        serve(&mut table, "a", 10, start);
        let t = |s: u64| start + Duration::from_secs(s);
        load(&mut table, "b", 20, t(10));
        serve(&mut table, "b", 1, t(10));
        load(&mut table, "c", 50, t(20));
        serve(&mut table, "c", 2, t(20));
        let plan = plan_of(table.decide(&model("new"), &est(20), &view(1), false, true, t(600)));
        assert_eq!(victims_of(&plan), [victim], "{eviction:?}");
        assert_within_capacity(&table);
    }
}

/// One load: the plan's victims go, the copy is ready, and it serves `uses` requests.
fn place(table: &mut Table, name: &str, mib: u64, uses: usize, at: Instant) -> Vec<String> {
    let plan = plan_of(table.decide(&model(name), &est(mib), &view(1), false, true, at));
    let victims = victims_of(&plan).iter().map(|v| v.to_string()).collect();
    depart_victims(table, &plan, at);
    table.finish_load(plan.backend, name, &Ok(()), at);
    serve(table, name, uses, at);
    victims
}

/// What TinyLFU's sketch adds: a model's requests are remembered after its copy is
/// evicted, and a model asked for once does not push out one asked for often. One backend
/// holds two 40 MiB models. `hot` is asked for 20 times, then pushed out by `a` (the only
/// copy idle past `min_churn_age`), then asked for again: its new copy has served one
/// request, fewer than `x`'s two, but the sketch counts 21. So `b` takes `x`'s place, and
/// `c` then takes the one-hit `b`'s, not `hot`'s.
#[tokio::test(start_paused = true)]
async fn tinylfu_remembers_a_model_across_its_eviction() {
    let start = Instant::now();
    let t = |s: u64| start + Duration::from_secs(s);
    let mut table = table(EvictionPolicy::Tinylfu, &[80], start);
    place(&mut table, "hot", 40, 20, start);
    place(&mut table, "x", 40, 1, t(1));
    serve(&mut table, "x", 1, t(70));
    assert_eq!(place(&mut table, "a", 40, 1, t(100)), ["hot"]);
    // hot comes back: of x (2 requests) and a (1), a goes.
    assert_eq!(place(&mut table, "hot", 40, 1, t(200)), ["a"]);
    // hot's copy has served 1 request, x's 2: the sketch remembers hot's 21.
    assert_eq!(place(&mut table, "b", 40, 1, t(400)), ["x"]);
    // b was asked for once: it goes, hot stays.
    assert_eq!(place(&mut table, "c", 40, 1, t(500)), ["b"]);
    assert_within_capacity(&table);
}

/// GDSF's reload cost is the load time it learned: of two models alike in size and use, the
/// one that loads slowly stays.
#[tokio::test(start_paused = true)]
async fn gdsf_keeps_the_model_that_is_slow_to_load() {
    for slow in ["a", "b"] {
        let start = Instant::now();
        let mut table = table(EvictionPolicy::Gdsf, &[100], start);
        for name in ["a", "b"] {
            load(&mut table, name, 45, start);
            serve(&mut table, name, 3, start);
        }
        table.learn_load_time(slow, Duration::from_secs(30));
        let later = start + Duration::from_secs(600);
        let plan = plan_of(table.decide(&model("new"), &est(20), &view(1), false, true, later));
        let fast = if slow == "a" { "b" } else { "a" };
        assert_eq!(victims_of(&plan), [fast]);
    }
}

/// The copy each policy would rank lowest (used first, least and biggest) is in use, pinned
/// or loading in turn: none of them is taken; once released and old enough, it is.
#[tokio::test(start_paused = true)]
async fn no_policy_evicts_a_copy_in_use_loading_or_pinned() {
    for eviction in POLICIES {
        let start = Instant::now();
        let mut table = table(eviction, &[100], start);
        // The lowest-ranked copy under every policy: used first, once, and big.
        load(&mut table, "busy", 60, start);
        assert!(matches!(
            table.decide(&model("busy"), &est(60), &view(1), false, true, start),
            Decision::Serve(0)
        ));
        let pinned = plan_of(table.decide(&model("pinned"), &est(20), &view(1), true, true, start));
        table.finish_load(0, &pinned.model, &Ok(()), start);
        // A load still running.
        let later = start + Duration::from_secs(600);
        plan_of(table.decide(&model("loading"), &est(20), &view(1), false, true, later));
        let much_later = later + Duration::from_secs(600);
        let refused = table.decide(&model("new"), &est(10), &view(1), false, true, much_later);
        assert!(
            matches!(refused, Decision::Refuse(GatewayError::NoRoom { .. })),
            "{eviction:?}: {refused:?}"
        );
        assert_within_capacity(&table);
        // Released, and past min_churn_age: now it goes (the others still stay).
        table.release(0, "busy", much_later);
        table.finish_load(0, "loading", &Ok(()), much_later);
        serve(&mut table, "loading", 5, much_later);
        let last = much_later + Duration::from_secs(600);
        let plan = plan_of(table.decide(&model("new"), &est(10), &view(1), false, true, last));
        assert_eq!(victims_of(&plan), ["busy"], "{eviction:?}");
        assert_within_capacity(&table);
    }
}

/// A copy used within `min_churn_age` is never a victim, whatever the policy thinks of it:
/// the next copy in the policy's order goes instead, and when only recent copies could make
/// room the answer is the churn guard's 503 with the time until they are old enough.
#[tokio::test(start_paused = true)]
async fn no_policy_evicts_a_copy_used_within_min_churn_age() {
    for eviction in POLICIES {
        let start = Instant::now();
        let mut table = table(eviction, &[100], start);
        let t = |s: u64| start + Duration::from_secs(s);
        // "old": used often, long ago. "young": big and used once, just now: LFU and GDSF
        // would take it first.
        load(&mut table, "old", 40, start);
        serve(&mut table, "old", 100, start);
        load(&mut table, "young", 50, t(100));
        let plan = plan_of(table.decide(&model("new"), &est(40), &view(1), false, true, t(120)));
        assert_eq!(victims_of(&plan), ["old"], "{eviction:?}");
        depart_victims(&mut table, &plan, t(120));
        table.finish_load(0, "new", &Ok(()), t(120));
        assert_within_capacity(&table);
        // Room now means evicting "young" (used at 100 s) or "new" (120 s): refused until
        // "young" is 60 s old.
        match table.decide(&model("big"), &est(55), &view(1), false, true, t(130)) {
            Decision::Refuse(GatewayError::Churn { retry_after }) => {
                assert_eq!(retry_after, Duration::from_secs(30), "{eviction:?}")
            }
            other => panic!("{eviction:?}: {other:?}"),
        }
        let plan = plan_of(table.decide(&model("big"), &est(55), &view(1), false, true, t(160)));
        assert_eq!(victims_of(&plan), ["young"], "{eviction:?}");
        assert_within_capacity(&table);
    }
}

/// `keep` copies go last under every policy: after any other copy on their backend, and
/// only on a backend where nothing else would do.
#[tokio::test(start_paused = true)]
async fn kept_models_are_evicted_last() {
    for eviction in POLICIES {
        let start = Instant::now();
        let t = |s: u64| start + Duration::from_secs(s);
        let mut order = EvictionOrder::new(eviction, start);
        let kept = ModelWeight {
            keep: true,
            cost_weight: 1.0,
        };
        order.weigh("kept", kept);
        let mut table = Table::new(&[100 * MIB, 100 * MIB], policy(), start).with_order(order);
        // The kept model is the first, least used and biggest: every policy's first victim.
        let kept_on = load(&mut table, "kept", 60, start);
        let other_on = load(&mut table, "other", 30, t(10));
        assert_ne!(kept_on, other_on);
        serve(&mut table, "other", 50, t(10));
        load(&mut table, "small", 30, t(20));
        serve(&mut table, "small", 50, t(20));
        // A 50 MiB model: the kept model's backend would need it gone; the other backend
        // gives up a copy that is not kept.
        let plan = plan_of(table.decide(&model("new"), &est(50), &view(2), false, true, t(600)));
        assert_ne!(plan.backend, kept_on, "{eviction:?}");
        assert!(!victims_of(&plan).contains(&"kept"), "{eviction:?}");
        depart_victims(&mut table, &plan, t(600));
        table.finish_load(plan.backend, "new", &Ok(()), t(600));
        // Then with the other backend's copies in use, only the kept model can make room
        // for an 80 MiB one: it goes, last.
        for name in ["other", "small", "new"] {
            if table.located.of(name).eq([other_on]) {
                serve_and_hold(&mut table, name, t(600));
            }
        }
        let plan = plan_of(table.decide(&model("huge"), &est(80), &view(2), false, true, t(1200)));
        assert_eq!(plan.backend, kept_on, "{eviction:?}");
        assert!(victims_of(&plan).contains(&"kept"), "{eviction:?}");
        assert_within_capacity(&table);
    }
}

/// Random traffic under each policy: the books stay within capacity and in step, and no
/// victim is ever held by a request or used within `min_churn_age`.
#[test]
fn random_traffic_keeps_every_rule_under_every_policy() {
    for eviction in POLICIES {
        let start = Instant::now();
        let mut table = table(eviction, &[300, 200], start);
        let mut held: Vec<(usize, String)> = Vec::new();
        let mut seed = 11u64;
        let mut evictions = 0;
        for step in 0..5_000u64 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let now = start + Duration::from_secs(45 * step);
            let name = format!("m{}", (seed >> 33) % 12);
            if (seed >> 20).is_multiple_of(3) && !held.is_empty() {
                let (b, name) = held.swap_remove((seed >> 40) as usize % held.len());
                table.release(b, &name, now);
                continue;
            }
            let size = est(40 + (seed >> 50) % 60);
            match table.decide(&model(&name), &size, &view(2), false, true, now) {
                Decision::Serve(b) => held.push((b, name)),
                Decision::Load(plan) => {
                    for victim in &plan.evict {
                        assert!(
                            !held
                                .iter()
                                .any(|(b, m)| *b == plan.backend && *m == victim.model),
                            "{eviction:?} evicted {} in use",
                            victim.model
                        );
                        assert!(
                            victim.idle >= Duration::from_secs(60),
                            "{eviction:?} evicted {} idle {:?}",
                            victim.model,
                            victim.idle
                        );
                    }
                    evictions += plan.evict.len();
                    depart_victims(&mut table, &plan, now);
                    let ok = !(seed >> 45).is_multiple_of(7);
                    let outcome = if ok { Ok(()) } else { Err("boom".into()) };
                    table.finish_load(plan.backend, &name, &outcome, now);
                }
                Decision::Wait(_) | Decision::Refuse(_) => {}
            }
            assert_within_capacity(&table);
        }
        assert!(
            evictions > 50,
            "{eviction:?}: the traffic must evict ({evictions})"
        );
    }
}
