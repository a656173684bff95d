//! SIPClusters in the production shape: three `nodewarden run` processes as
//! the ServiceAccount of manifests/base/rbac.yaml, traces exported to Jaeger. Two
//! SIPClusters are created at once over a pool that fits one; the leader is
//! SIGKILLed as soon as the first host is claimed. A watch checks that no
//! host ever changes hands; at the end exactly the winner's hosts carry
//! labels. Then a host fails and its replacement is read back from Jaeger.

use crate::support;

use std::time::{Duration, Instant};

use crate::support::jaeger::Jaeger;
use crate::support::replicas::*;
use crate::support::sip::*;
use crate::support::{Probe, TestEnv, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use nodewarden::api::metal3::BareMetalHost;
use nodewarden::api::sip::{SIPCluster, labels};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_claim_through_a_leader_kill_and_trace_a_host_replacement() {
    let jaeger = Jaeger::start();
    let env = TestEnv::new("sip-ha").await;
    support::install_crds(&env.client).await;
    put_ssh_keys(&env).await;
    // 30 racks of one control-plane host; each cluster wants 20 + 4.
    create_racks(&env, 30, 1).await;

    let dir = replica_log_dir(&env.id);
    let kubeconfig = service_account_kubeconfig(&env.client, &dir).await;
    let lease_name = format!("nodewarden-{}", env.id);
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), SYSTEM_NAMESPACE);
    let mut replicas = Replicas::start(
        3,
        &env,
        &kubeconfig,
        &lease_name,
        &jaeger.otlp_endpoint,
        &[],
        &dir,
    );
    wait_for("a leader", Duration::from_secs(30), || async {
        match holder(&leases, &lease_name).await {
            Some(h) => Probe::Done(h),
            None => Probe::NotYet("no holder".into()),
        }
    })
    .await;
    let stop = tokio_util::sync::CancellationToken::new();
    let checker = tokio::spawn(watch_claims(
        env.client.clone(),
        env.namespace.clone(),
        stop.clone(),
    ));

    let (a, b) = tokio::join!(
        create_sip(&env, "alpha", spec(&env, (20, 4), (0, 0), 30300)),
        create_sip(&env, "beta", spec(&env, (20, 4), (0, 0), 30310)),
    );
    a.expect("creating alpha");
    b.expect("creating beta");
    // SIGKILL the leader the moment a host is claimed.
    let hosts = hosts_api(&env);
    let any_claim = ListParams::default().labels(labels::CLUSTER_NAME);
    let at_kill = loop {
        let n = hosts.list(&any_claim).await.map(|l| l.items.len()).unwrap_or(0);
        if n > 0 {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let leader = holder(&leases, &lease_name).await.expect("a leader");
    let killed = Instant::now();
    replicas.kill(&leader).await;
    let claimed_when_killed = hosts.list(&any_claim).await.map(|l| l.items.len()).unwrap_or(0);
    let (next, took) = wait_for_new_leader(&leases, &lease_name, &leader, killed).await;
    replicas.restart(&leader);
    println!(
        "SIGKILL of leader {leader} with {at_kill} host(s) claimed ({claimed_when_killed} once dead): {next} took over after {took:?}"
    );

    let sips: Api<SIPCluster> = Api::namespaced(env.client.clone(), &env.namespace);
    let winner = wait_for("one SIPCluster Ready", Duration::from_secs(60), || async {
        let ready = |s: &SIPCluster| {
            s.status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .any(|c| c.type_ == "Ready" && c.status == "True")
        };
        for name in ["alpha", "beta"] {
            if let Ok(s) = sips.get(name).await
                && ready(&s)
            {
                return Probe::Done(name);
            }
        }
        Probe::NotYet("neither Ready".into())
    })
    .await;
    let loser = if winner == "alpha" { "beta" } else { "alpha" };
    wait_ready(&env, loser, "False", "Unschedulable").await;
    // No orphan: every claimed host is the winner's, exactly as many as it wants.
    let labelled = hosts.list(&any_claim).await.expect("hosts").items;
    let owners: Vec<String> = labelled
        .iter()
        .map(|h| h.labels().get(labels::CLUSTER_NAME).cloned().unwrap_or_default())
        .collect();
    assert!(
        owners.iter().all(|o| o == winner),
        "only {winner} holds hosts: {owners:?}"
    );
    let mine = claimed(&env, winner).await;
    let active: Vec<&String> = mine
        .iter()
        .filter(|(_, (_, s))| s == "active")
        .map(|(n, _)| n)
        .collect();
    assert_eq!((mine.len(), active.len()), (24, 20), "{mine:?}");

    // The leader's gauges show the winner's hosts.
    let leader = holder(&leases, &lease_name).await.expect("a leader");
    let ns = env.namespace.clone();
    let series = |state: &str| {
        format!(
            "nodewarden_sip_hosts{{cluster_namespace=\"{ns}\",cluster=\"{winner}\",role=\"ControlPlane\",state=\"{state}\"}}"
        )
    };
    wait_for("the leader's SIP gauges", Duration::from_secs(15), || async {
        let scraped = match replicas.scrape().await {
            Ok(s) => s,
            Err(e) => return Probe::NotYet(e),
        };
        let got: Vec<Option<f64>> = ["active", "standby", "wanted"]
            .iter()
            .map(|s| metric_value(&scraped[&leader], &series(s)))
            .collect();
        match got.as_slice() {
            [Some(20.0), Some(4.0), Some(24.0)] => Probe::Done(()),
            other => Probe::NotYet(format!("{other:?}")),
        }
    })
    .await;

    // A host fails: the standby takes over; the replacement is one trace.
    let failed = active[0].clone();
    set_host_status(&env, &failed, "error", "provisioned").await;
    wait_for("the failed host replaced", Duration::from_secs(20), || async {
        let now = claimed(&env, winner).await;
        let active = now.values().filter(|(_, s)| s == "active").count();
        match (now.contains_key(&failed), active) {
            (false, 20) => Probe::Done(()),
            other => Probe::NotYet(format!("{other:?}")),
        }
    })
    .await;
    let traces = wait_for(
        "the replace host trace in Jaeger",
        Duration::from_secs(30),
        || async {
            match jaeger.traces("nodewarden", "replace host").await {
                Ok(t) if !t.is_empty() => Probe::Done(t),
                Ok(_) => Probe::NotYet("no trace yet".into()),
                Err(e) => Probe::NotYet(e),
            }
        },
    )
    .await;
    let root = traces[0].root("replace host").expect("a root span");
    assert_eq!(
        root.tag_str("nodewarden.host.old"),
        Some(format!("{}/{failed}", env.namespace).as_str())
    );
    assert_eq!(root.tag_str("nodewarden.role"), Some("ControlPlane"));
    assert!(root.tag_str("nodewarden.host.new").is_some_and(|n| !n.is_empty()));
    let ops = traces[0].operations();
    assert!(
        ops.contains("promote standby") && ops.contains("update services"),
        "{ops:?}"
    );

    stop.cancel();
    let breaches = checker.await.expect("the checker");
    assert!(
        breaches.is_empty(),
        "hosts changed hands: {breaches:#?}\n{}",
        replicas.tail_logs()
    );
    for name in ["alpha", "beta"] {
        delete_sip_and_wait(&env, name).await;
    }
    let left: Vec<BareMetalHost> = hosts.list(&any_claim).await.expect("hosts").items;
    assert!(left.is_empty(), "every host released");
    drop(replicas);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = leases.delete(&lease_name, &DeleteParams::default()).await;
    env.cleanup().await;
}
