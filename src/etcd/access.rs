//! How nodewarden reaches etcd when it retires a control-plane node. With no
//! setting it finds etcd as Constellation's operator does: the control-plane
//! nodes' InternalIPs at the client port, with the control plane's own
//! certificates (kubeadm's `/etc/kubernetes/pki/etcd`: `ca.crt`, `peer.crt`,
//! `peer.key`). Where etcd runs stacked and cannot be reached that way, the
//! retirement waits, saying what to set: a control-plane node retired with
//! its member still listed leaves a dead voter behind.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::client::{EtcdClient, EtcdConfig, EtcdError};
use super::placement::EtcdPlacement;

/// Where kubeadm (and so Constellation) keeps etcd's certificates.
pub const DEFAULT_PKI_DIR: &str = "/etc/kubernetes/pki/etcd";
/// etcd's client port on a kubeadm control-plane node.
pub const DEFAULT_CLIENT_PORT: u16 = 2379;

/// How etcd is reached (the operator's `--etcd-*` flags).
#[derive(Clone, Debug)]
pub enum EtcdSetup {
    /// `--etcd-endpoints`: every retired control-plane node's member is
    /// looked for there.
    Endpoints(Arc<EtcdClient>),
    /// Found on the control-plane nodes (the default).
    Discover(Discovery),
    /// External etcd (`--etcd-on-control-plane=false`): no member is
    /// nodewarden's to touch.
    External,
}

impl Default for EtcdSetup {
    fn default() -> Self {
        EtcdSetup::Discover(Discovery::default())
    }
}

/// Where stacked etcd is looked for, and with which certificates.
#[derive(Clone, Debug, PartialEq)]
pub struct Discovery {
    /// Which control-plane nodes run a member: those with a static etcd pod
    /// (`Detect`), or all (`ControlPlane`).
    pub placement: EtcdPlacement,
    /// The members' client port on each node's InternalIP.
    pub client_port: u16,
    /// The CA of etcd's certificates.
    pub ca: PathBuf,
    /// The client certificate (the control plane's peer certificate, as
    /// Constellation uses it).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// Limit of one call.
    pub timeout: Duration,
}

impl Default for Discovery {
    fn default() -> Self {
        Discovery::in_dir(Path::new(DEFAULT_PKI_DIR))
    }
}

impl Discovery {
    /// The defaults, with the certificates of `dir` (`ca.crt`, `peer.crt`, `peer.key`).
    pub fn in_dir(dir: &Path) -> Discovery {
        Discovery {
            placement: EtcdPlacement::Detect,
            client_port: DEFAULT_CLIENT_PORT,
            ca: dir.join("ca.crt"),
            cert: dir.join("peer.crt"),
            key: dir.join("peer.key"),
            timeout: super::client::DEFAULT_TIMEOUT,
        }
    }

    /// A client for the members on `ips` (the control-plane nodes'), or why
    /// there is none: a certificate file this replica cannot read names
    /// itself (the PKI not mounted, or the replica on another node).
    pub fn client(&self, ips: &[IpAddr]) -> Result<EtcdClient, EtcdError> {
        for file in [&self.ca, &self.cert, &self.key] {
            if let Err(e) = std::fs::metadata(file) {
                return Err(EtcdError::Config(format!("{}: {e}", file.display())));
            }
        }
        EtcdClient::new(EtcdConfig {
            endpoints: self.endpoints(ips),
            ca: Some(self.ca.clone()),
            cert: Some(self.cert.clone()),
            key: Some(self.key.clone()),
            timeout: self.timeout,
        })
    }

    /// `https://<ip>:<port>` of each of `ips`, brackets around an IPv6 address.
    pub fn endpoints(&self, ips: &[IpAddr]) -> Vec<String> {
        let port = self.client_port;
        ips.iter()
            .map(|ip| match ip {
                IpAddr::V4(v4) => format!("https://{v4}:{port}"),
                IpAddr::V6(v6) => format!("https://[{v6}]:{port}"),
            })
            .collect()
    }
}

/// The files of the control plane's etcd PKI nodewarden reads.
pub const PKI_FILES: [&str; 3] = ["ca.crt", "peer.crt", "peer.key"];

/// Copies [`PKI_FILES`] from `from` (the host's, readable by root only) to
/// `to` (a volume of the pod, group-owned by its fsGroup), readable by the
/// owner and the group only: the chart's init container runs this as root
/// so that nodewarden itself runs as user 65532. Returns how many were
/// copied; none where `from` lacks them (a node that is no control-plane
/// node: etcd found from there is reported unreachable when it matters).
pub fn copy_pki(from: &Path, to: &Path) -> std::io::Result<usize> {
    use std::os::unix::fs::PermissionsExt;
    if !PKI_FILES.iter().all(|f| from.join(f).is_file()) {
        return Ok(0);
    }
    for file in PKI_FILES {
        let target = to.join(file);
        let partial = to.join(format!(".{file}.partial"));
        std::fs::copy(from.join(file), &partial)?;
        std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o640))?;
        std::fs::rename(&partial, &target)?;
    }
    Ok(PKI_FILES.len())
}

/// What a Degraded condition and an Event say when stacked etcd cannot be
/// reached: what failed and what to set.
pub fn unreachable_advice(node: &str, member: &str, why: &str) -> String {
    format!(
        "node {node} runs an etcd member ({member}) that nodewarden cannot reach to remove before the node goes: {why}; \
         the node is not retired. Mount the control plane's etcd certificates ({DEFAULT_PKI_DIR}: the chart's \
         etcd.hostPKI, on by default, with nodewarden on a control-plane node), or set --etcd-endpoints with \
         --etcd-ca, --etcd-cert and --etcd-key (chart: etcd.endpoints, etcd.clientSecret); \
         --etcd-on-control-plane=false if etcd is external"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovered_endpoints_and_missing_certificates() {
        let dir = tempfile::tempdir().expect("a dir");
        let discovery = Discovery::in_dir(dir.path());
        assert_eq!(discovery.ca, dir.path().join("ca.crt"));
        assert_eq!(discovery.cert, dir.path().join("peer.crt"));
        let ips: Vec<IpAddr> = ["10.0.0.2", "fd00::3"]
            .iter()
            .filter_map(|s| s.parse().ok())
            .collect();
        let missing = discovery.client(&ips).expect_err("no certificates there");
        assert!(
            missing
                .to_string()
                .contains(&dir.path().join("ca.crt").display().to_string()),
            "{missing}"
        );
        assert_eq!(
            discovery.endpoints(&ips),
            [
                "https://10.0.0.2:2379".to_string(),
                "https://[fd00::3]:2379".to_string()
            ]
        );
        assert_eq!(
            Discovery::default().ca,
            Path::new("/etc/kubernetes/pki/etcd/ca.crt")
        );
        let to = tempfile::tempdir().expect("a dir");
        assert_eq!(copy_pki(dir.path(), to.path()).expect("nothing to copy"), 0);
        for (i, file) in PKI_FILES.iter().enumerate() {
            std::fs::write(dir.path().join(file), format!("pem {i}")).expect("a file");
        }
        assert_eq!(copy_pki(dir.path(), to.path()).expect("copied"), 3);
        for (i, file) in PKI_FILES.iter().enumerate() {
            use std::os::unix::fs::PermissionsExt;
            let copied = to.path().join(file);
            assert_eq!(
                std::fs::read_to_string(&copied).expect("read"),
                format!("pem {i}")
            );
            let mode = std::fs::metadata(&copied).expect("metadata").permissions().mode();
            assert_eq!(mode & 0o777, 0o640, "{file}");
        }
        let advice = unreachable_advice("cp-1", "static pod kube-system/etcd-cp-1", "no answer");
        for wanted in [
            "cp-1",
            "--etcd-endpoints",
            "etcd.hostPKI",
            "no answer",
            "not retired",
        ] {
            assert!(advice.contains(wanted), "{wanted}: {advice}");
        }
    }
}
