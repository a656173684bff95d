//! The upgrade-agent's contract, as Constellation's
//! `upgrade-agent/upgradeproto/upgrade.proto` and
//! `internal/versions/components/components.proto` define it: package
//! `upgrade`, service `Update`, one method `ExecuteUpdate`. The message and
//! field numbers are the interface (fields 1 and 2 of the request are
//! reserved upstream); gRPC carries each message length-prefixed.

use serde::Deserialize;

/// The method's path on the agent's socket.
pub const EXECUTE_UPDATE: &str = "/upgrade.Update/ExecuteUpdate";

/// `components.Component`: one file the agent installs before it runs kubeadm.
#[derive(Clone, PartialEq, Eq, prost::Message, Deserialize)]
pub struct Component {
    /// An http(s) URL or a `data:` URL.
    #[prost(string, tag = "1")]
    #[serde(default, alias = "URL")]
    pub url: String,
    /// `sha256:<hex>` of what the URL serves (empty: not checked).
    #[prost(string, tag = "2")]
    #[serde(default, alias = "Hash")]
    pub hash: String,
    /// Where it goes on the node (a directory when extracted).
    #[prost(string, tag = "3")]
    #[serde(default, alias = "InstallPath")]
    pub install_path: String,
    /// A .tar.gz to extract into `install_path`.
    #[prost(bool, tag = "4")]
    #[serde(default, alias = "Extract")]
    pub extract: bool,
}

/// `upgrade.ExecuteUpdateRequest`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ExecuteUpdateRequest {
    /// The Kubernetes version kubeadm upgrades to (`v1.31.12`).
    #[prost(string, tag = "3")]
    pub wanted_kubernetes_version: String,
    /// What the agent installs first.
    #[prost(message, repeated, tag = "4")]
    pub kubernetes_components: Vec<Component>,
}

/// `upgrade.ExecuteUpdateResponse` (empty).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ExecuteUpdateResponse {}

/// The ConfigMap key that lists a components reference's components (JSON).
pub const COMPONENTS_KEY: &str = "components";

/// The components of a components ConfigMap's `components` value, as
/// Constellation writes them (current and legacy key names).
pub fn parse_components(json: &str) -> Result<Vec<Component>, serde_json::Error> {
    serde_json::from_str(json)
}

/// What the agent is sent, as Constellation's operator sends it: the
/// components that change kubeadm's upgrade (`data:` URLs, its patches)
/// and kubeadm itself; the kubelet and the rest come with new nodes.
pub fn upgradable(components: &[Component]) -> Vec<Component> {
    components
        .iter()
        .filter(|c| c.url.starts_with("data:") || c.install_path.ends_with("kubeadm"))
        .cloned()
        .collect()
}

/// gRPC's length-prefixed message: not compressed, the length big-endian.
pub fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 5);
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// The message of one length-prefixed gRPC frame, or why there is none.
pub fn unframe(body: &[u8]) -> Result<&[u8], String> {
    let (header, rest) = body
        .split_at_checked(5)
        .ok_or_else(|| format!("a gRPC frame of {} bytes", body.len()))?;
    if header[0] != 0 {
        return Err("a compressed gRPC message (none was asked for)".into());
    }
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    rest.get(..len)
        .ok_or_else(|| format!("a gRPC frame announcing {len} bytes with {} there", rest.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// The request's bytes, worked out from protobuf's encoding rules by
    /// hand: what any implementation of the contract sends.
    #[test]
    fn the_request_encodes_as_the_contract_says() {
        let request = ExecuteUpdateRequest {
            wanted_kubernetes_version: "v1.31.12".into(),
            kubernetes_components: vec![Component {
                url: "data:,x".into(),
                hash: "sha256:ab".into(),
                install_path: "/opt/p".into(),
                extract: true,
            }],
        };
        let mut golden = vec![0x1a, 8];
        golden.extend_from_slice(b"v1.31.12");
        // field 4, length-delimited: the component (1 url, 2 hash, 3 path, 4 bool).
        let mut component = vec![0x0a, 7];
        component.extend_from_slice(b"data:,x");
        component.extend_from_slice(&[0x12, 9]);
        component.extend_from_slice(b"sha256:ab");
        component.extend_from_slice(&[0x1a, 6]);
        component.extend_from_slice(b"/opt/p");
        component.extend_from_slice(&[0x20, 1]);
        golden.extend_from_slice(&[0x22, component.len() as u8]);
        golden.extend_from_slice(&component);
        assert_eq!(request.encode_to_vec(), golden);
        assert_eq!(
            ExecuteUpdateRequest::decode(golden.as_slice()).expect("decodes"),
            request
        );
        // Fields at their default are left out; the response is empty.
        assert_eq!(ExecuteUpdateRequest::default().encode_to_vec(), Vec::<u8>::new());
        assert_eq!(ExecuteUpdateResponse {}.encode_to_vec(), Vec::<u8>::new());
        // The reserved fields 1 and 2 (kubeadm_url, kubeadm_hash) of an older sender are skipped.
        let older = [0x0a, 1, b'u', 0x12, 1, b'h', 0x1a, 2, b'v', b'1'];
        assert_eq!(
            ExecuteUpdateRequest::decode(older.as_slice())
                .expect("decodes")
                .wanted_kubernetes_version,
            "v1"
        );
    }

    #[test]
    fn frames_carry_one_message() {
        let framed = frame(b"abc");
        assert_eq!(framed, [0, 0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(unframe(&framed), Ok(&b"abc"[..]));
        assert_eq!(unframe(&[0, 0, 0, 0, 0]), Ok(&b""[..]));
        assert!(unframe(&[0, 0, 0]).is_err());
        assert!(unframe(&[1, 0, 0, 0, 0]).is_err());
        assert!(unframe(&[0, 0, 0, 0, 9, 1]).is_err());
    }

    #[test]
    fn components_as_constellation_writes_them_and_what_is_sent() {
        let json = r#"[
            {"url": "https://example/kubelet", "hash": "sha256:1", "install_path": "/run/state/bin/kubelet"},
            {"url": "https://example/kubeadm", "hash": "sha256:2", "install_path": "/run/state/bin/kubeadm"},
            {"URL": "data:application/json;base64,e30=", "InstallPath": "/opt/kubernetes/patches/kube-apiserver+json.json"},
            {"url": "https://example/cni.tgz", "install_path": "/opt/cni/bin", "extract": true}
        ]"#;
        let all = parse_components(json).expect("parses");
        assert_eq!(all.len(), 4);
        assert_eq!(all[2].url, "data:application/json;base64,e30=");
        assert!(all[3].extract);
        let sent = upgradable(&all);
        let sent: Vec<&str> = sent.iter().map(|c| c.install_path.as_str()).collect();
        assert_eq!(
            sent,
            [
                "/run/state/bin/kubeadm",
                "/opt/kubernetes/patches/kube-apiserver+json.json"
            ]
        );
        assert!(parse_components("{}").is_err());
    }
}
