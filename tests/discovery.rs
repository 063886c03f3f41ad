//! The pool follows its Tritons: a `[[backends]]` group named by DNS (a Kubernetes
//! headless Service) is resolved every `upstream.discovery_interval`. Against a real DNS
//! server (Debian's dnsmasq, records rewritten as pods come and go) and real Tritons on
//! 127.0.0.2 and 127.0.0.3 at the same ports, as two pods of one Service.

mod support;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::dns::Dns;
use support::gateway::TestGateway;
use support::{Triton, TritonOptions, eventually, identity_request, infer, metric_sum};

const SERVICE: &str = "triton.test";
const POD_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const POD_B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);

/// A gateway config whose only backend entry is the DNS group `pod`.
fn group_config(dns: &Dns, ports: [u16; 3]) -> String {
    format!(
        "[listen]\nhttp = \"127.0.0.1:0\"\nmetrics = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\ngrpc = \"127.0.0.1:0\"\n\
         [upstream]\nhealth_interval = \"200ms\"\ndiscovery_interval = \"300ms\"\ndns_server = \"{}\"\n\
         [placement]\nmodel_repository = \"{}\"\nscale_up_rps = 0.0\n\
         [[backends]]\nname = \"pod\"\ndns = \"{SERVICE}\"\nhttp_port = {}\ngrpc_port = {}\nmetrics_port = {}\ncapacity = \"1GiB\"\n",
        dns.address,
        support::model_repository().display(),
        ports[0],
        ports[1],
        ports[2],
    )
}

/// Names of the backends in the gateway's pool.
async fn pool(gateway: &TestGateway) -> Vec<String> {
    let mut names: Vec<String> = (gateway.admin_backends().await.iter())
        .map(|b| b["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// Names of the backends whose books hold a ready copy of `model`.
async fn holders(gateway: &TestGateway, model: &str) -> Vec<String> {
    let placement = gateway.placement().await;
    (placement["backends"].as_array().unwrap().iter())
        .filter(|b| {
            (b["models"].as_array().unwrap().iter())
                .any(|m| m["name"] == model && m["state"] == "ready")
        })
        .map(|b| b["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_pool_named_by_dns_follows_its_tritons_as_they_come_and_go() {
    let mut dns = Dns::start().expect("dnsmasq starts");
    let ports = support::free_ports::<3>().unwrap();
    let at = |address| TritonOptions {
        address: Some(address),
        ports: Some(ports),
        ..Default::default()
    };
    let (a, b) = tokio::join!(Triton::start(at(POD_A)), Triton::start(at(POD_B)));
    let (mut a, b) = (
        a.expect("triton on 127.0.0.2"),
        b.expect("triton on 127.0.0.3"),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("infergate.toml");
    std::fs::write(&path, group_config(&dns, ports)).unwrap();
    let gateway = TestGateway::start_from_file_unready(&path, None).await;
    let client = reqwest::Client::new();
    let url = gateway.url();
    let (pod_a, pod_b) = (format!("pod-{POD_A}"), format!("pod-{POD_B}"));

    // 1. The Service has no pods yet: the pool is empty and a request waits for one.
    assert!(pool(&gateway).await.is_empty());
    let ready = client.get(format!("{url}/v2/health/ready")).send().await;
    assert_eq!(ready.unwrap().status(), 503);
    let held = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move {
            let started = Instant::now();
            let answer = infer(&client, &url, "sized_a", &identity_request()).await;
            (answer, started.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!held.is_finished(), "the request waits for a pod");
    dns.publish(SERVICE, &[IpAddr::V4(POD_A)]);
    let ((status, body), waited) = held.await.unwrap();
    assert_eq!(status, 200, "{body}");
    eprintln!("held for the first pod: {waited:?}");
    assert!(
        waited < Duration::from_secs(10),
        "served within ready_wait: {waited:?}"
    );
    assert_eq!(pool(&gateway).await, [pod_a.as_str()]);

    // 2. A second pod appears: it joins the pool empty and takes the next load (the most
    //    free room). A reload that changes nothing about the backends keeps both.
    dns.publish(SERVICE, &[IpAddr::V4(POD_A), IpAddr::V4(POD_B)]);
    gateway.wait_for_ready_backends(2).await;
    let (status, body) = infer(&client, &url, "sized_b", &identity_request()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(holders(&gateway, "sized_b").await, [pod_b.as_str()]);
    assert_eq!(b.loaded_models().await.unwrap(), ["sized_b"]);
    std::fs::write(
        &path,
        group_config(&dns, ports)
            + "[[routes]]\nmodel = \"identity\"\ntargets = [{ model = \"sized_a\", weight = 1 }]\n",
    )
    .unwrap();
    let (status, reloaded) = gateway
        .admin_call(reqwest::Method::POST, "/admin/reload")
        .await;
    assert_eq!(status, 200, "{reloaded}");
    assert_eq!(
        reloaded["added_backends"],
        serde_json::json!([]),
        "{reloaded}"
    );
    assert_eq!(
        reloaded["removed_backends"],
        serde_json::json!([]),
        "{reloaded}"
    );
    assert_eq!(pool(&gateway).await, [pod_a.as_str(), pod_b.as_str()]);

    // 3. The first pod leaves the Service while traffic runs on its model: it is drained,
    //    its model is placed on the other pod on the next request, and only then does the
    //    pod stop. No request is lost.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic: Vec<_> = (0..4)
        .map(|_| {
            let (client, url, stop) = (client.clone(), url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    answers.push(infer(&client, &url, "sized_a", &identity_request()).await);
                }
                answers
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    dns.publish(SERVICE, &[IpAddr::V4(POD_B)]);
    eventually(
        Duration::from_secs(5),
        "the vanished pod leaves the pool",
        async || {
            let pool = pool(&gateway).await;
            if pool == [pod_b.as_str()] {
                Ok(())
            } else {
                Err(pool)
            }
        },
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "its model is placed on the pod that stays",
        async || {
            if holders(&gateway, "sized_a").await == [pod_b.as_str()] {
                Ok(())
            } else {
                Err(gateway.placed().await)
            }
        },
    )
    .await;
    a.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    for task in traffic {
        answers.extend(task.await.unwrap());
    }
    let failed: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    eprintln!(
        "while the pod left: {} requests, {} failed",
        answers.len(),
        failed.len()
    );
    assert!(
        answers.len() > 20,
        "traffic ran: {} requests",
        answers.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}",
        failed.len(),
        answers.len(),
        &failed[..failed.len().min(3)]
    );
    let mut on_b = b.loaded_models().await.unwrap();
    on_b.sort();
    assert_eq!(on_b, ["sized_a", "sized_b"]);

    // 4. DNS stops answering: the pool keeps what it has, serves, and counts the failures.
    dns.stop();
    eventually(
        Duration::from_secs(15),
        "lookups without an answer are counted",
        async || {
            let metrics = gateway.metrics_text("/metrics").await;
            metric_sum(
                &metrics,
                "infergate_discovery_failures_total",
                &["group=\"pod\""],
            ) >= 2.0
        },
    )
    .await;
    assert_eq!(pool(&gateway).await, [pod_b.as_str()]);
    for _ in 0..5 {
        let (status, body) = infer(&client, &url, "sized_a", &identity_request()).await;
        assert_eq!(status, 200, "{body}");
    }
    let metrics = gateway.metrics_text("/metrics").await;
    assert_eq!(
        metric_sum(
            &metrics,
            "infergate_discovered_backends",
            &["group=\"pod\""]
        ),
        1.0
    );
}
