//! `placement.policy` against real Triton: the same skewed workload under `lru`, `lfu`,
//! `gdsf` and `tinylfu` evicts the model each policy should, the one `infergate-simulate`'s replay of the
//! same trace predicts, and Triton's index always matches the gateway's books within
//! capacity.
//!
//! Four identity models (copies of `sized_a`) with sizes set in `[[models]]`, one backend
//! with room for 1000 MiB: `p_a` (200 MiB) is used five times first, `p_b` (100 MiB) once,
//! `p_c` (500 MiB) twice, then `p_d` (300 MiB) needs one of them to go. LRU takes `p_a` (used
//! longest ago), LFU `p_b` (used least), GDSF `p_c` (its two uses are worth least per byte of
//! reload), and TinyLFU `p_c` too (two requests in its sketch, per GiB^1.15 of reload: about
//! a third of `p_b`'s worth).

mod support;

use infergate::config::EvictionPolicy;
use infergate_simulator::{Real, Setup, parse, run};
use std::path::Path;
use std::time::Duration;
use support::gateway::{TestGateway, pool_config_in};
use support::{Triton, TritonOptions, copy_dir, identity_request, infer, model_repository};

const MIB: u64 = 1 << 20;
/// (model, size in MiB, requests), in the order the workload sends them.
const WORKLOAD: [(&str, u64, usize); 4] = [
    ("p_a", 200, 5),
    ("p_b", 100, 1),
    ("p_c", 500, 2),
    ("p_d", 300, 1),
];

/// A repository of identity models named after `WORKLOAD`.
fn repository(dir: &Path) {
    for (name, _, _) in WORKLOAD {
        let to = dir.join(name);
        copy_dir(&model_repository().join("sized_a"), &to);
        let _ = std::fs::remove_file(to.join("1").join("weights.bin"));
        let config = std::fs::read_to_string(to.join("config.pbtxt")).unwrap();
        let config = config.replace("name: \"sized_a\"", &format!("name: \"{name}\""));
        std::fs::write(to.join("config.pbtxt"), config).unwrap();
    }
}

/// The workload as a trace for the simulator: each model's requests at once, five seconds
/// after the last model's (its load long done), as the test sends them.
fn trace_csv() -> (String, String) {
    let mut requests = String::new();
    let mut sizes = String::new();
    for (i, (name, mib, count)) in WORKLOAD.iter().enumerate() {
        for _ in 0..*count {
            requests += &format!("{},{name}\n", 5000 * i);
        }
        sizes += &format!("{name},{}\n", mib * MIB);
    }
    (requests, sizes)
}

/// What the simulator's replay of the real table leaves loaded after the trace, under
/// `policy`, on one backend like the test's (python models load in about a second each).
fn predicted(policy: EvictionPolicy) -> Vec<String> {
    let (requests, sizes) = trace_csv();
    let trace = parse(&requests, Some(&sizes), 0).unwrap();
    let setup = Setup {
        usable: vec![1000 * MIB],
        min_churn_age: Duration::ZERO,
        load_base: Duration::from_secs(1),
        load_per_gib: Duration::ZERO,
        service: Duration::from_millis(10),
        max_loading: 2,
        pinned: 0,
        failing: 0.0,
        max_attempts: 3,
        estimate_before_load: None,
        scaling: None,
    };
    let mut real = Real::new(&trace, &setup, policy);
    let outcome = run(&mut real, &trace, &setup);
    assert_eq!(
        outcome.evictions, 1,
        "{policy:?}: the trace makes one victim"
    );
    real.placed().remove(0)
}

/// Triton's READY models, sorted.
async fn triton_index(triton: &Triton) -> Vec<String> {
    let mut models = triton.loaded_models().await.unwrap();
    models.sort();
    models
}

/// The gateway's books are Triton's index, and within the backend's capacity.
async fn assert_books_are_tritons(gateway: &TestGateway, triton: &Triton) {
    assert_eq!(gateway.placed().await, [triton_index(triton).await]);
    let placement = gateway.placement().await;
    let backend = &placement["backends"][0];
    assert!(
        backend["used"].as_u64().unwrap() <= backend["capacity"].as_u64().unwrap(),
        "{backend}"
    );
}

#[tokio::test]
async fn each_policy_evicts_the_model_the_simulator_predicts() {
    let dir = tempfile::tempdir().unwrap();
    repository(dir.path());
    let triton = Triton::start(TritonOptions {
        repository: Some(dir.path().to_path_buf()),
        ..Default::default()
    })
    .await
    .expect("triton starts");
    let models: String = WORKLOAD
        .iter()
        .map(|(name, mib, _)| format!("[[models]]\nname = \"{name}\"\nsize = \"{mib}MiB\"\n"))
        .collect();
    for (policy, victim) in [
        (EvictionPolicy::Lru, "p_a"),
        (EvictionPolicy::Lfu, "p_b"),
        (EvictionPolicy::Gdsf, "p_c"),
        (EvictionPolicy::Tinylfu, "p_c"),
    ] {
        let name = format!("{policy:?}").to_lowercase();
        let placement = format!(
            "policy = \"{name}\"\nmem_buffer = \"0\"\nmin_churn_age = \"0s\"\nscale_up_rps = 0.0"
        );
        let config = pool_config_in(
            dir.path(),
            &format!("policy-{name}"),
            &[&triton],
            "1000MiB",
            &placement,
            &models,
        );
        let gateway = TestGateway::start(&config).await;
        assert_eq!(gateway.placement().await["policy"], name);
        let (client, url, request) = (reqwest::Client::new(), gateway.url(), identity_request());
        for (model, _, count) in WORKLOAD {
            // A model's requests at once, as several clients send them: one load, all served.
            let answers = futures_util::future::join_all(
                (0..count).map(|_| infer(&client, &url, model, &request)),
            )
            .await;
            assert!(
                answers.iter().all(|(status, _)| *status == 200),
                "{name} {model}: {answers:?}"
            );
            assert_books_are_tritons(&gateway, &triton).await;
            // The next model's requests come later, as in the trace.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let loaded = triton_index(&triton).await;
        let expected: Vec<String> = ["p_a", "p_b", "p_c", "p_d"]
            .into_iter()
            .filter(|m| *m != victim)
            .map(String::from)
            .collect();
        assert_eq!(loaded, expected, "{name}: {victim} should have gone");
        assert_eq!(loaded, predicted(policy), "{name}: the simulator agrees");
        drop(gateway);
        for model in loaded {
            triton.unload_model(&model).await.unwrap();
        }
        while !triton_index(&triton).await.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
