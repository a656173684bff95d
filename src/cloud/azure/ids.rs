//! Azure's IDs: a scale set's ARM ID is the ScalingGroup's groupId, and a
//! node's provider ID is `azure://` + its scale-set VM's ARM ID, as the
//! Azure cloud provider writes it. ARM compares IDs case-insensitively; the
//! casing given is kept.

use super::super::CloudError;

/// What provider IDs start with.
pub const SCHEME: &str = "azure://";

/// A VM scale set: `/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachineScaleSets/V`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleSetRef {
    /// Its subscription.
    pub subscription: String,
    /// Its resource group.
    pub resource_group: String,
    /// Its name.
    pub name: String,
}

/// One VM of a scale set, by its instance ID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmRef {
    /// Its scale set.
    pub scale_set: ScaleSetRef,
    /// Its instance ID (`0`, `1`, ... in a Uniform scale set).
    pub instance_id: String,
}

impl ScaleSetRef {
    /// A scale set's ARM ID parsed (segment names in any case).
    pub fn parse(id: &str) -> Result<ScaleSetRef, CloudError> {
        let bad = |reason: &str| CloudError::Config(format!("scale set ID {id:?}: {reason}"));
        let parts: Vec<&str> = id.trim_start_matches('/').split('/').collect();
        match parts.as_slice() {
            [subs, s, rgs, rg, providers, compute, sets, name]
                if names(&[subs, rgs, providers, compute, sets])
                    && [s, rg, name].iter().all(|p| !p.is_empty()) =>
            {
                Ok(ScaleSetRef {
                    subscription: s.to_string(),
                    resource_group: rg.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(bad(
                "not /subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachineScaleSets/V",
            )),
        }
    }

    /// Its ARM ID.
    pub fn id(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachineScaleSets/{}",
            self.subscription, self.resource_group, self.name
        )
    }

    /// Its VM `instance_id`.
    pub fn vm(&self, instance_id: &str) -> VmRef {
        VmRef {
            scale_set: self.clone(),
            instance_id: instance_id.to_string(),
        }
    }
}

/// Whether the fixed segments are ARM's (in any case).
fn names(fixed: &[&&str; 5]) -> bool {
    let want = [
        "subscriptions",
        "resourceGroups",
        "providers",
        "Microsoft.Compute",
        "virtualMachineScaleSets",
    ];
    fixed
        .iter()
        .zip(want)
        .all(|(got, want)| got.eq_ignore_ascii_case(want))
}

impl VmRef {
    /// A provider ID parsed: `azure:///subscriptions/…/virtualMachineScaleSets/V/virtualMachines/ID`.
    pub fn parse(provider_id: &str) -> Result<VmRef, CloudError> {
        let bad = |reason: &str| CloudError::InvalidProviderId {
            provider_id: provider_id.to_string(),
            reason: reason.to_string(),
        };
        let id = provider_id
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("does not start with azure://"))?;
        let (set, instance) = id
            .rsplit_once('/')
            .ok_or_else(|| bad("names no virtual machine"))?;
        let (set, vms) = set.rsplit_once('/').ok_or_else(|| bad("names no scale set"))?;
        if !vms.eq_ignore_ascii_case("virtualMachines") || instance.is_empty() {
            return Err(bad("not a scale set's VM (…/virtualMachines/<instance ID>)"));
        }
        let scale_set = ScaleSetRef::parse(set).map_err(|_| bad("names no VM scale set"))?;
        Ok(scale_set.vm(instance))
    }

    /// Its ARM ID.
    pub fn id(&self) -> String {
        format!("{}/virtualMachines/{}", self.scale_set.id(), self.instance_id)
    }

    /// Its provider ID.
    pub fn provider_id(&self) -> String {
        format!("{SCHEME}{}", self.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_and_print_as_arm_writes_them() {
        let id = "/subscriptions/s-1/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/workers";
        let set = ScaleSetRef::parse(id).expect("a scale set");
        assert_eq!(
            (
                set.subscription.as_str(),
                set.resource_group.as_str(),
                set.name.as_str()
            ),
            ("s-1", "rg", "workers")
        );
        assert_eq!(set.id(), id);
        let lower = "/subscriptions/s-1/resourcegroups/rg/providers/microsoft.compute/virtualmachinescalesets/workers";
        assert_eq!(ScaleSetRef::parse(lower).expect("any case"), set);
        let vm = VmRef::parse(&format!("azure://{id}/virtualMachines/7")).expect("a VM");
        assert_eq!(
            (vm.scale_set.clone(), vm.instance_id.as_str()),
            (set.clone(), "7")
        );
        assert_eq!(vm.provider_id(), format!("azure://{id}/virtualMachines/7"));
        for bad in [
            "gce://p/z/i",
            "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm",
            "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/w/virtualMachines/",
            "azure:///subscriptions//resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/w/virtualMachines/1",
        ] {
            assert!(
                matches!(VmRef::parse(bad), Err(CloudError::InvalidProviderId { .. })),
                "{bad}"
            );
        }
        assert!(ScaleSetRef::parse("/subscriptions/s/resourceGroups/rg").is_err());
    }
}
