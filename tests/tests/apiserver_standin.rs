//! The API server stand-in, driven by the real kube client.

use std::time::Duration;

use futures::StreamExt;
use integration_tests::apiserver::{ApiServer, Matcher};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

async fn client(server: &ApiServer) -> kube::Client {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).unwrap();
    gpu_dra_driver::service::kube_client::client_from_file(&path).await.unwrap()
}

fn slice(name: &str, node: &str, driver: &str, generation: i64) -> ResourceSlice {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        }
    }))
    .unwrap()
}

fn api_code(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(status) => (status.code, status.reason),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn create_get_conflict_and_generation() {
    let server = ApiServer::start().await.unwrap();
    let api: Api<ResourceSlice> = Api::all(client(&server).await);
    let created = api.create(&PostParams::default(), &slice("s1", "n1", "gpu.nvidia.com", 1)).await.unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    let rv1: u64 = meta.resource_version.as_deref().unwrap().parse().unwrap();

    let (code, reason) =
        api_code(api.create(&PostParams::default(), &slice("s1", "n1", "gpu.nvidia.com", 1)).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));
    let (code, reason) = api_code(api.get("missing").await.unwrap_err());
    assert_eq!((code, reason.as_str()), (404, "NotFound"));

    // A spec change bumps generation and resourceVersion.
    let mut changed = created.clone();
    changed.spec.pool.generation = 2;
    let updated = api.replace("s1", &PostParams::default(), &changed).await.unwrap();
    assert_eq!(updated.metadata.generation, Some(2));
    let rv2: u64 = updated.metadata.resource_version.as_deref().unwrap().parse().unwrap();
    assert!(rv2 > rv1);
    // A label-only change does not.
    let labeled = api
        .patch("s1", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})))
        .await
        .unwrap();
    assert_eq!(labeled.metadata.generation, Some(2));

    // Replacing from the stale copy is a 409 Conflict.
    let (code, reason) = api_code(api.replace("s1", &PostParams::default(), &changed).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (409, "Conflict"));

    // Immutable fields and slice validation are enforced (422).
    let mut moved = labeled.clone();
    moved.spec.node_name = Some("n2".into());
    let (code, _) = api_code(api.replace("s1", &PostParams::default(), &moved).await.unwrap_err());
    assert_eq!(code, 422);
    let (code, _) =
        api_code(api.create(&PostParams::default(), &slice("bad", "n1", "gpu.nvidia.com", -1)).await.unwrap_err());
    assert_eq!(code, 422);
}

#[tokio::test]
async fn generate_name_and_namespaced_objects() {
    let server = ApiServer::start().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client(&server).await, "kube-node-lease");
    let lease: Lease =
        serde_json::from_value(json!({"metadata": {"generateName": "l-"}, "spec": {"holderIdentity": "me"}})).unwrap();
    let a = leases.create(&PostParams::default(), &lease).await.unwrap();
    let b = leases.create(&PostParams::default(), &lease).await.unwrap();
    let (na, nb) = (a.metadata.name.unwrap(), b.metadata.name.unwrap());
    assert!(na.starts_with("l-") && na.len() == 7 && na != nb, "{na} {nb}");
    assert_eq!(a.metadata.namespace.as_deref(), Some("kube-node-lease"));
    assert_eq!(leases.list(&ListParams::default()).await.unwrap().items.len(), 2);
    // A PUT of a missing slice does not create it.
    let slices: Api<ResourceSlice> = Api::all(client(&server).await);
    let (code, _) =
        api_code(slices.replace("s", &PostParams::default(), &slice("s", "n", "d.example.com", 1)).await.unwrap_err());
    assert_eq!(code, 404);
    // Leases may be created by PUT and are never updated unconditionally.
    let mut put: Lease = serde_json::from_value(json!({"metadata": {"name": "by-put"}})).unwrap();
    let created = leases.replace("by-put", &PostParams::default(), &put).await.unwrap();
    assert!(created.metadata.uid.is_some());
    put.spec = Some(Default::default());
    let (code, reason) = api_code(leases.replace("by-put", &PostParams::default(), &put).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    put.metadata.resource_version = created.metadata.resource_version;
    leases.replace("by-put", &PostParams::default(), &put).await.unwrap();
    let other: Api<Lease> = Api::namespaced(client(&server).await, "other");
    assert!(other.list(&ListParams::default()).await.unwrap().items.is_empty());
}

#[tokio::test]
async fn field_selectors_and_delete_collection() {
    let server = ApiServer::start().await.unwrap();
    let api: Api<ResourceSlice> = Api::all(client(&server).await);
    for (name, node, driver) in
        [("a", "n1", "gpu.nvidia.com"), ("b", "n1", "other.example.com"), ("c", "n2", "gpu.nvidia.com")]
    {
        api.create(&PostParams::default(), &slice(name, node, driver, 1)).await.unwrap();
    }
    let names = |list: kube::core::ObjectList<ResourceSlice>| {
        list.items.into_iter().filter_map(|s| s.metadata.name).collect::<Vec<_>>()
    };
    let ours = api.list(&ListParams::default().fields("spec.nodeName=n1,spec.driver=gpu.nvidia.com")).await.unwrap();
    assert!(ours.metadata.resource_version.is_some());
    assert_eq!(names(ours), ["a"]);
    assert_eq!(names(api.list(&ListParams::default().fields("spec.nodeName=n1")).await.unwrap()), ["a", "b"]);
    assert_eq!(names(api.list(&ListParams::default().fields("metadata.name=c")).await.unwrap()), ["c"]);
    let (code, _) = api_code(api.list(&ListParams::default().fields("spec.bogus=1")).await.unwrap_err());
    assert_eq!(code, 400);

    // The kubelet's wipe at start: every slice of its node, all drivers.
    let deleted = api
        .delete_collection(&DeleteParams::default(), &ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(deleted.left().map(|l| l.items.len()), Some(2));
    assert_eq!(names(api.list(&ListParams::default()).await.unwrap()), ["c"]);
    api.delete("c", &DeleteParams::default()).await.unwrap();
    let (code, _) = api_code(api.delete("c", &DeleteParams::default()).await.unwrap_err());
    assert_eq!(code, 404);
}

#[tokio::test]
async fn status_subresource_separates_spec_and_status() {
    let server = ApiServer::start().await.unwrap();
    let api: Api<ResourceClaim> = Api::namespaced(client(&server).await, "ns");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]},
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &claim).await.unwrap();
    assert!(created.status.is_none(), "create drops status");
    let status = json!({"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]}}}});
    let allocated = api.patch_status("c", &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
    assert!(allocated.status.as_ref().and_then(|s| s.allocation.as_ref()).is_some());
    assert_eq!(allocated.metadata.generation, created.metadata.generation);
    // The main resource ignores status; the spec is immutable.
    let cleared = api
        .patch("c", &PatchParams::default(), &Patch::Merge(json!({"status": null, "metadata": {"labels": {"x": "y"}}})))
        .await
        .unwrap();
    assert!(cleared.status.and_then(|s| s.allocation).is_some());
    let (code, _) = api_code(
        api.patch("c", &PatchParams::default(), &Patch::Merge(json!({"spec": {"devices": {"requests": []}}})))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);
    // Tests can also place an allocated claim directly.
    let mut direct = claim.clone();
    direct.metadata.name = Some("d".into());
    let stored = server.create_with_status(&direct).unwrap();
    assert!(stored.status.is_some());
    assert!(api.get("d").await.unwrap().status.is_some());
}

#[tokio::test]
async fn server_side_apply_creates_replaces_and_conflicts() {
    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(client(&server).await);
    let pp = PatchParams::apply("driver");
    let applied = api
        .patch(
            "n1",
            &pp,
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"a": "1", "b": "2"}}}),
            ),
        )
        .await
        .unwrap();
    assert!(applied.metadata.uid.is_some());
    // Dropping a field it owned removes it.
    let applied = api
        .patch(
            "n1",
            &pp,
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"a": "1"}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(applied.metadata.labels.unwrap().into_iter().collect::<Vec<_>>(), [("a".to_string(), "1".to_string())]);
    // Another manager changing an owned field conflicts unless forced.
    let other = PatchParams::apply("other");
    let change =
        Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"a": "2"}}}));
    let (code, reason) = api_code(api.patch("n1", &other, &change).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    let forced = api.patch("n1", &other.force(), &change).await.unwrap();
    assert_eq!(forced.metadata.labels.unwrap().get("a").map(String::as_str), Some("2"));
}

#[tokio::test]
async fn watch_streams_events_bookmarks_and_410() {
    let server = ApiServer::start().await.unwrap();
    let api: Api<ResourceSlice> = Api::all(client(&server).await);
    let list = api.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let wp = WatchParams::default().fields("spec.nodeName=n1").timeout(30);
    let mut stream = api.watch(&wp, &rv).await.unwrap().boxed();
    api.create(&PostParams::default(), &slice("a", "n1", "gpu.nvidia.com", 1)).await.unwrap();
    api.create(&PostParams::default(), &slice("other", "n2", "gpu.nvidia.com", 1)).await.unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match stream.next().await.unwrap().unwrap() {
            WatchEvent::Added(s) => seen.push(format!("ADDED {}", s.metadata.name.unwrap())),
            WatchEvent::Deleted(s) => seen.push(format!("DELETED {}", s.metadata.name.unwrap())),
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["ADDED a", "DELETED a"]);
    // Bookmarks arrive on an idle watch that allows them.
    let bookmark = loop {
        if let WatchEvent::Bookmark(b) = stream.next().await.unwrap().unwrap() {
            break b;
        }
    };
    assert!(bookmark.metadata.resource_version.parse::<u64>().unwrap() > rv.parse::<u64>().unwrap());

    // After compaction, the old resourceVersion is gone: an ERROR event with 410.
    server.store().compact();
    let mut stream = api.watch(&wp, &rv).await.unwrap().boxed();
    match stream.next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn faults_fail_requests_and_drop_watches() {
    let server = ApiServer::start().await.unwrap();
    let api: Api<ResourceSlice> = Api::all(client(&server).await);
    server.faults().fail_next(Matcher::new("POST", "/resourceslices"), 1, 500);
    let (code, _) =
        api_code(api.create(&PostParams::default(), &slice("a", "n1", "d.example.com", 1)).await.unwrap_err());
    assert_eq!(code, 500);
    api.create(&PostParams::default(), &slice("a", "n1", "d.example.com", 1)).await.unwrap();
    assert_eq!(server.faults().count(&Matcher::new("POST", "/resourceslices"), 500), 1);

    let mut stream = api.watch(&WatchParams::default().timeout(60), "0").await.unwrap().boxed();
    assert!(matches!(stream.next().await, Some(Ok(WatchEvent::Added(_)))));
    server.faults().drop_watches();
    let end = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match stream.next().await {
                None => break true,
                Some(Ok(WatchEvent::Bookmark(_))) => continue,
                Some(_) => break false,
            }
        }
    })
    .await;
    assert_eq!(end.ok(), Some(true), "the watch ends when dropped");
    // Typed direct access mirrors what clients see.
    assert_eq!(server.list::<ResourceSlice>(None, "spec.driver=d.example.com").unwrap().len(), 1);
}

#[tokio::test]
async fn a_filtered_watch_sees_objects_leave_and_enter_the_selection() {
    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(client(&server).await);
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1", "labels": {"gpu": "yes"}}})).unwrap();
    api.create(&PostParams::default(), &node).await.unwrap();
    let mut stream = api.watch(&WatchParams::default().labels("gpu=yes").timeout(30), "0").await.unwrap().boxed();
    let mut next = async || loop {
        match stream.next().await.unwrap().unwrap() {
            WatchEvent::Added(n) => break format!("ADDED {}", n.metadata.name.unwrap()),
            WatchEvent::Modified(n) => break format!("MODIFIED {}", n.metadata.name.unwrap()),
            WatchEvent::Deleted(n) => break format!("DELETED {}", n.metadata.name.unwrap()),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    };
    assert_eq!(next().await, "ADDED n1");
    let label = |v: &str| Patch::Merge(json!({"metadata": {"labels": {"gpu": v}}}));
    api.patch("n1", &PatchParams::default(), &label("no")).await.unwrap();
    assert_eq!(next().await, "DELETED n1");
    api.patch("n1", &PatchParams::default(), &label("yes")).await.unwrap();
    assert_eq!(next().await, "ADDED n1");
}

/// Finalizers and graceful deletion, as the registry's `Store.Delete` and
/// `Store.Update` handle them: DELETE of an object with finalizers sets
/// `deletionTimestamp` and keeps it; no finalizer may be added then; the
/// update that removes the last one deletes it (one DELETED event).
#[tokio::test]
async fn finalizers_hold_a_deleted_object_until_removed() {
    let server = ApiServer::start().await.unwrap();
    let api: Api<ResourceClaim> = Api::namespaced(client(&server).await, "default");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "c", "finalizers": ["gpu.nvidia.com/allocation"]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &claim).await.unwrap();
    let mut events = api.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    let _added = events.next().await;

    api.delete("c", &DeleteParams::default()).await.unwrap();
    let held = api.get("c").await.unwrap();
    let deleted_at = held.metadata.deletion_timestamp.clone();
    assert!(deleted_at.is_some(), "DELETE with finalizers sets deletionTimestamp");
    api.delete("c", &DeleteParams::default()).await.unwrap();
    assert_eq!(api.get("c").await.unwrap().metadata.deletion_timestamp, deleted_at, "set once");

    let mut more = held.clone();
    more.metadata.finalizers.get_or_insert_default().push("other/finalizer".into());
    let (code, _) = api_code(api.replace("c", &PostParams::default(), &more).await.unwrap_err());
    assert_eq!(code, 422, "no new finalizers while deleting");

    let mut none = api.get("c").await.unwrap();
    none.metadata.finalizers = Some(vec![]);
    api.replace("c", &PostParams::default(), &none).await.unwrap();
    assert_eq!(api_code(api.get("c").await.unwrap_err()).0, 404);
    let mut kinds = Vec::new();
    while let Some(Ok(event)) = tokio::time::timeout(Duration::from_millis(300), events.next()).await.ok().flatten() {
        kinds.push(match event {
            WatchEvent::Added(_) => "ADDED",
            WatchEvent::Modified(_) => "MODIFIED",
            WatchEvent::Deleted(_) => "DELETED",
            _ => "OTHER",
        });
    }
    assert_eq!(kinds, ["MODIFIED", "DELETED"]);
}

/// Pods and `events.k8s.io/v1` Events are served with their field labels.
#[tokio::test]
async fn pods_and_events_with_field_selectors() {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::events::v1::Event;
    let server = ApiServer::start().await.unwrap();
    let client = client(&server).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["a", "b"] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running"},
        }))
        .unwrap();
        // A new pod is Pending whatever its status says; only /status moves it.
        let created = pods.create(&PostParams::default(), &pod).await.unwrap();
        assert_eq!(created.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
    }
    let status = json!({"status": {"phase": "Running"}});
    pods.patch_status("b", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    let pending = pods.list(&ListParams::default().fields("status.phase=Pending")).await.unwrap();
    assert_eq!(pending.items.iter().map(|p| p.metadata.name.clone().unwrap()).collect::<Vec<_>>(), ["a"]);

    let events: Api<Event> = Api::namespaced(client, "default");
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": "c.1"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "gpu.nvidia.com/controller",
        "reportingInstance": "r",
        "action": "Allocate",
        "reason": "Unsatisfiable",
        "type": "Warning",
        "note": "no H100 free",
        "regarding": {"kind": "ResourceClaim", "name": "c", "namespace": "default"},
    }))
    .unwrap();
    events.create(&PostParams::default(), &event).await.unwrap();
    let found = events.list(&ListParams::default().fields("regarding.name=c,reason=Unsatisfiable")).await.unwrap();
    assert_eq!(found.items.len(), 1);
    assert!(events.list(&ListParams::default().fields("regarding.name=d")).await.unwrap().items.is_empty());
}

/// The stand-in is Kubernetes 1.37 unless a test says otherwise: its
/// `/version` and its ResourceSlice rules follow the release set (1.34
/// refuses a taint with effect None, which 1.35+ accept).
#[tokio::test]
async fn the_release_it_reports_and_validates_as_can_be_set() {
    let server = ApiServer::start().await.unwrap();
    let client = client(&server).await;
    assert_eq!(client.apiserver_version().await.unwrap().minor, "37");
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let mut tainted = slice("tainted", "node-a", "gpu.nvidia.com", 1);
    tainted.spec.devices = Some(vec![
        serde_json::from_value(json!({"name": "gpu-0", "taints": [{"key": "k", "effect": "None"}]})).unwrap(),
    ]);
    server.set_server_minor(34);
    assert_eq!(client.apiserver_version().await.unwrap().minor, "34");
    let (code, reason) = api_code(slices.create(&PostParams::default(), &tainted).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    server.set_server_minor(37);
    slices.create(&PostParams::default(), &tainted).await.unwrap();
}
