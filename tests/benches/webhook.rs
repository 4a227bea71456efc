//! The webhook's answer to a claim no node can hold, at fleet scale: 1,000
//! nodes × 16 GPUs in the API stand-in, the controller (release build)
//! serving its webhook, and reviews of a claim with 17 one-GPU requests
//! (each review with its own request names, so that no search is reused).
//! Before the allocator counted, each such review searched every node until
//! its step budget ran out (~0.7 s a node) and was cut at 5 s. Prints the
//! latency of each review over HTTPS (target < 100 ms) and of a plain
//! review right after. Figures only.
//!
//! `cargo bench -p integration-tests --bench webhook`

use std::time::{Duration, Instant};

use integration_tests::https_client;
use integration_tests::webhook_process::{WebhookOptions, WebhookProcess, review};
use serde_json::{Value, json};

const NODES: usize = 1000;
const GPUS: usize = 16;
const REVIEWS: usize = 20;

fn claim(i: usize, requests: usize) -> Value {
    let requests: Vec<Value> = (0..requests)
        .map(|r| json!({"name": format!("r{i}-{r}"), "exactly": {"deviceClassName": "gpu.nvidia.com"}}))
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": format!("c{i}"), "namespace": "default"},
           "spec": {"devices": {"requests": requests}}})
}

fn main() {
    println!("webhook benchmark (cargo bench -p integration-tests --bench webhook)");
    integration_tests::controller();
    let webhook = WebhookProcess::start(&WebhookOptions { nodes: NODES, gpus_per_node: GPUS, fd_limit: None });
    let config = webhook.client(&[b"http/1.1"]);
    println!("fleet: {NODES} nodes x {GPUS} GPUs ({} devices)", NODES * GPUS);
    let mut took: Vec<Duration> = Vec::new();
    for i in 0..REVIEWS {
        let start = Instant::now();
        let (status, body) =
            https_client::post(webhook.port, &config, "/validate", &review(&format!("u{i}"), claim(i, GPUS + 1)))
                .expect("the review is answered");
        took.push(start.elapsed());
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if status != 200 || answer["response"]["allowed"] != true || answer["response"]["uid"] != format!("u{i}") {
            println!("unexpected answer {status}: {answer}");
            return;
        }
    }
    took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let median = took[took.len() / 2];
    let worst = took[took.len() - 1];
    let verdict = if worst < Duration::from_millis(100) { "ok" } else { "MISSED" };
    println!(
        "  review of {} one-GPU requests (ms)   min {:>7.1}  median {:>7.1}  max {:>7.1}   target < 100   {verdict}",
        GPUS + 1,
        ms(took[0]),
        ms(median),
        ms(worst)
    );
    let start = Instant::now();
    let _ = https_client::post(webhook.port, &config, "/validate", &review("plain", claim(REVIEWS, 1)));
    println!("  a one-GPU review right after (ms)   {:>7.1}", ms(start.elapsed()));
}
