//! What a BareMetalHost's records say (pure): its addresses from its
//! networkData Secret, its BMC's management address.

use std::collections::BTreeMap;

use serde::Deserialize;

/// OpenStack `network_data` (what metal3's networkData Secret holds, JSON
/// or YAML): only the networks and their addresses are read.
#[derive(Debug, Default, Deserialize)]
struct NetworkData {
    #[serde(default)]
    networks: Vec<Network>,
}

#[derive(Debug, Deserialize)]
struct Network {
    id: String,
    #[serde(default)]
    ip_address: Option<String>,
}

/// Network id → address, from a networkData document; what went wrong
/// when it cannot be read.
pub fn addresses(network_data: &[u8]) -> Result<BTreeMap<String, String>, String> {
    let parsed: NetworkData = serde_norway::from_slice(network_data)
        .map_err(|e| format!("networkData is not OpenStack network_data: {e}"))?;
    Ok(parsed
        .networks
        .into_iter()
        .filter_map(|n| Some((n.id, n.ip_address?)))
        .collect())
}

/// A BMC's management address as the jump host's `host` tool uses it: the
/// URL's host and port, as upstream SIP takes Go's `url.Host`
/// (`redfish+http://10.0.0.1:8000/redfish/v1/Systems/1` → `10.0.0.1:8000`,
/// `ipmi://[fd00::1]:623` → `[fd00::1]:623`); credentials in the URL are
/// left out. An address without a scheme is taken whole (upstream yields
/// nothing for it).
pub fn management_address(bmc_address: &str) -> Option<String> {
    let rest = bmc_address
        .split_once("://")
        .map_or(bmc_address, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    (!authority.is_empty()).then(|| authority.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_from_json_and_yaml() {
        let json = br#"{"links":[{"id":"oam","type":"phy"}],
            "networks":[{"id":"oam-ipv4","link":"oam","type":"ipv4","ip_address":"10.23.25.101"},
                        {"id":"pxe-ipv4","link":"pxe","type":"ipv4_dhcp"}]}"#;
        let got = addresses(json).expect("json");
        assert_eq!(got.get("oam-ipv4").map(String::as_str), Some("10.23.25.101"));
        assert!(!got.contains_key("pxe-ipv4"), "dhcp networks have no address");
        let yaml = b"networks:\n- id: oam-ipv4\n  ip_address: 10.0.0.7\n";
        assert_eq!(
            addresses(yaml).expect("yaml").get("oam-ipv4").map(String::as_str),
            Some("10.0.0.7")
        );
        assert!(addresses(b"networks: 3").is_err());
    }

    #[test]
    fn management_addresses() {
        for (address, host) in [
            (
                "redfish+http://10.23.25.1:8000/redfish/v1/Systems/air-ctrl-1",
                Some("10.23.25.1:8000"),
            ),
            ("redfish+http://10.0.0.1:8000", Some("10.0.0.1:8000")),
            ("ipmi://192.168.111.1:6230", Some("192.168.111.1:6230")),
            ("ipmi://[fd00::1]:623", Some("[fd00::1]:623")),
            ("redfish://user:pw@10.0.0.2/redfish/v1", Some("10.0.0.2")),
            (
                "idrac-virtualmedia://bmc.example.com/redfish/v1/Systems/1",
                Some("bmc.example.com"),
            ),
            ("10.0.0.1", Some("10.0.0.1")),
            ("", None),
        ] {
            assert_eq!(management_address(address).as_deref(), host, "{address}");
        }
    }
}
