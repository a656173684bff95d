//! The provider's changes and group reads, each a few Compute calls.

use serde_json::{Value, json};

use super::api::{self, Operation};
use super::ids::{self, GroupRef, InstanceRef};
use super::{
    CLUSTER_LABEL, CloudError, CreateNodeRequest, CreatedNode, GcpProvider, NODE_GROUP_LABEL, ROLE_LABEL,
    ScalingGroup, errors, role_of, template_copy, template_image, template_label,
};

/// How many names after the current template's a template change tries
/// before giving up (each taken by a template on another image).
const TEMPLATE_NAME_TRIES: usize = 5;

impl GcpProvider {
    pub(super) async fn create(&self, request: &CreateNodeRequest) -> Result<CreatedNode, CloudError> {
        let group = GroupRef::parse(&request.group_id)?;
        let manager = self.group_manager(&group).await?;
        let name = match &request.request_id {
            Some(key) => ids::instance_name_for(&manager.base_instance_name, key),
            None => ids::random_instance_name(&manager.base_instance_name),
        };
        let at = InstanceRef {
            project: group.project.clone(),
            zone: group.zone.clone(),
            name,
        };
        // Asked before (its answer lost): the instance is there, in this group.
        if request.request_id.is_some() && self.is_member(&at, &group).await? {
            return Ok(created(&at));
        }
        let what = format!("creating instance {} in {}", at.name, group.id());
        let path = format!("{}/createInstances", manager_path(&group));
        let body = json!({"instances": [{"name": at.name}]});
        let operation: Operation = self.compute.post(&path, &body, &what).await?;
        let done = self
            .compute
            .wait_done(&group.project, operation, super::OPERATION_TIMEOUT, &what)
            .await?;
        // The name was taken by the first try of this request: the same instance.
        if errors::already_exists(done.errors()) && self.is_member(&at, &group).await? {
            return Ok(created(&at));
        }
        api::check(done, &what)?;
        Ok(created(&at))
    }

    /// Whether the instance exists and `group` made it.
    async fn is_member(&self, at: &InstanceRef, group: &GroupRef) -> Result<bool, CloudError> {
        let instance = match self.instance(at).await {
            Ok(instance) => instance,
            Err(CloudError::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        let maker = self.group_of(at, &instance).await?;
        if maker == *group {
            return Ok(true);
        }
        Err(CloudError::Rejected {
            status: 409,
            message: format!(
                "instance {} exists but belongs to {}, not {}",
                at.provider_id(),
                maker.id(),
                group.id()
            ),
        })
    }

    pub(super) async fn delete(&self, provider_id: &str) -> Result<(), CloudError> {
        let at = InstanceRef::parse(provider_id)?;
        let instance = match self.instance(&at).await {
            Ok(instance) => instance,
            // Already gone: nothing left to delete.
            Err(CloudError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let group = self.group_of(&at, &instance).await?;
        let what = format!("deleting instance {provider_id} from {}", group.id());
        let body = json!({"instances": [at.zonal_path()], "skipInstancesOnValidationError": true});
        let path = format!("{}/deleteInstances", manager_path(&group));
        let operation: Operation = self.compute.post(&path, &body, &what).await?;
        match self.finish(&group.project, operation, &what).await {
            Ok(_) | Err(CloudError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn group_image_of(&self, group_id: &str) -> Result<String, CloudError> {
        let group = GroupRef::parse(group_id)?;
        let manager = self.group_manager(&group).await?;
        let template = self.template(&manager.instance_template).await?;
        image_of(&template, &manager.instance_template)
    }

    pub(super) async fn set_image(&self, group_id: &str, image: &str) -> Result<(), CloudError> {
        let group = GroupRef::parse(group_id)?;
        let manager = self.group_manager(&group).await?;
        let current = self.template(&manager.instance_template).await?;
        if ids::short(image_of(&current, &manager.instance_template)?.as_str()) == ids::short(image) {
            return Ok(());
        }
        let link = self.template_with(&group.project, &current, image).await?;
        let what = format!("setting the instance template of {} to {link}", group.id());
        let path = format!("{}/setInstanceTemplate", manager_path(&group));
        let operation: Operation = self
            .compute
            .post(&path, &json!({"instanceTemplate": link}), &what)
            .await?;
        self.finish(&group.project, operation, &what).await.map(|_| ())
    }

    /// A template like `current` on `image`, under the next free name (one
    /// made by an earlier try whose answer was lost is used again): its URL.
    async fn template_with(&self, project: &str, current: &Value, image: &str) -> Result<String, CloudError> {
        let mut name = current["name"].as_str().unwrap_or_default().to_string();
        for _ in 0..TEMPLATE_NAME_TRIES {
            name = ids::next_template_name(&name);
            let link = format!(
                "{}projects/{project}/global/instanceTemplates/{name}",
                ids::URL_PREFIX
            );
            match self.template(&link).await {
                Ok(found) if template_image(&found).map(ids::short) == Some(ids::short(image)) => {
                    return Ok(link);
                }
                Ok(_) => continue,
                Err(CloudError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
            let what = format!("creating instance template {name}");
            let copy = template_copy(current, &name, image);
            let path = format!("projects/{project}/global/instanceTemplates");
            let operation: Operation = self.compute.post(&path, &copy, &what).await?;
            self.finish(project, operation, &what).await?;
            return Ok(link);
        }
        Err(CloudError::Rejected {
            status: 409,
            message: format!(
                "the {TEMPLATE_NAME_TRIES} instance template names after {} are taken by templates on other images",
                current["name"].as_str().unwrap_or_default()
            ),
        })
    }

    pub(super) async fn groups(&self) -> Result<Vec<ScalingGroup>, CloudError> {
        let mut out = Vec::new();
        for manager in self.compute.all_group_managers(&self.project).await? {
            let template = match self.template(&manager.instance_template).await {
                Ok(t) => t,
                // A regional template (another cluster's, or one nodewarden
                // cannot copy), or one deleted since.
                Err(CloudError::Config(why)) => {
                    tracing::warn!(group = %manager.name, "not a scaling group of nodewarden's: {why}");
                    continue;
                }
                Err(CloudError::NotFound { .. }) => continue,
                Err(e) => return Err(e),
            };
            if template_label(&template, CLUSTER_LABEL) != Some(self.cluster_uid.as_str()) {
                continue;
            }
            let group = GroupRef {
                project: self.project.clone(),
                zone: ids::zone_name(&manager.zone).to_string(),
                name: manager.name.clone(),
            };
            out.push(ScalingGroup {
                id: group.id(),
                role: role_of(template_label(&template, ROLE_LABEL)),
                name: template_label(&template, NODE_GROUP_LABEL)
                    .unwrap_or(&manager.name)
                    .to_string(),
                size: u32::try_from(manager.target_size).unwrap_or(0),
                image: image_of(&template, &manager.instance_template)?,
            });
        }
        Ok(out)
    }
}

/// The path of a group's manager under compute/v1.
fn manager_path(group: &GroupRef) -> String {
    format!(
        "projects/{}/zones/{}/instanceGroupManagers/{}",
        group.project, group.zone, group.name
    )
}

/// What a create returns: the Node is named after the instance.
fn created(at: &InstanceRef) -> CreatedNode {
    CreatedNode {
        node_name: at.name.clone(),
        provider_id: at.provider_id(),
        image: None,
    }
}

/// A template's boot image, short, or why there is none.
fn image_of(template: &Value, link: &str) -> Result<String, CloudError> {
    template_image(template)
        .map(|i| ids::short(i).to_string())
        .ok_or_else(|| {
            CloudError::InvalidResponse(format!(
                "instance template {} has no boot disk image",
                ids::short(link)
            ))
        })
}
