//! The EC2 and Auto Scaling calls nodewarden makes, typed: each builds its
//! parameters as the SDKs serialize them and reads the fields it needs from
//! the answer's XML (element names from botocore's service models: EC2's
//! camelCase `...Set/item`, Auto Scaling's PascalCase `.../member`).

use super::super::CloudError;
use super::form::Params;
use super::query::{QueryClient, Service};
use super::xml::Xml;

/// An Auto Scaling group, as far as nodewarden reads it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Group {
    /// The group's name (a ScalingGroup's groupId).
    pub name: String,
    /// How many instances the group keeps.
    pub desired_capacity: i32,
    /// Its launch template (directly or through a mixed instances policy).
    pub template: Option<TemplateRef>,
    /// Its instances, with their lifecycle states.
    pub instances: Vec<GroupInstance>,
    /// Its tags, key and value.
    pub tags: Vec<(String, String)>,
}

/// A group's launch template: its id or name, and the version it names.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TemplateRef {
    /// `lt-...`, when the group names it by id.
    pub id: Option<String>,
    /// The template's name, when the group names it so.
    pub name: Option<String>,
    /// A number, `$Default` or `$Latest`.
    pub version: Option<String>,
}

/// An instance as an Auto Scaling group lists it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GroupInstance {
    /// The instance id.
    pub id: String,
    /// The group's name.
    pub group: String,
    /// Its availability zone.
    pub zone: String,
    /// `Pending`, `InService`, `Terminating`, `Detaching`, ...
    pub lifecycle_state: String,
}

/// An EC2 instance, as far as nodewarden reads it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Instance {
    /// The instance id.
    pub id: String,
    /// The AMI it runs.
    pub image_id: Option<String>,
    /// The name its Node gets.
    pub private_dns_name: Option<String>,
    /// Its availability zone.
    pub zone: Option<String>,
    /// `pending`, `running`, `shutting-down`, `terminated`, `stopping`, `stopped`.
    pub state: Option<String>,
    /// Its tags, key and value.
    pub tags: Vec<(String, String)>,
}

/// A launch template version's number and the settings nodewarden copies.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TemplateVersion {
    /// The version's number.
    pub number: Option<i64>,
    /// What instances launched from it get.
    pub data: TemplateData,
}

/// The settings of a launch template version nodewarden reads and copies.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TemplateData {
    /// The AMI.
    pub image_id: Option<String>,
    /// The instance type.
    pub instance_type: Option<String>,
    /// The SSH key pair's name.
    pub key_name: Option<String>,
    /// The user data, base64 as EC2 holds it.
    pub user_data: Option<String>,
    /// The security groups' ids.
    pub security_group_ids: Vec<String>,
    /// The instance profile's ARN.
    pub iam_profile_arn: Option<String>,
    /// The instance profile's name.
    pub iam_profile_name: Option<String>,
}

/// Which launch template a call is about: `lt-...` is an id, else a name.
fn template_param(params: Params, template: &str) -> Params {
    if template.starts_with("lt-") {
        params.set("LaunchTemplateId", template)
    } else {
        params.set("LaunchTemplateName", template)
    }
}

fn ec2(action: &str) -> Params {
    Params::new(action, Service::Ec2.version())
}

fn asg(action: &str) -> Params {
    Params::new(action, Service::AutoScaling.version())
}

/// DescribeAutoScalingGroups of named groups, or of those a tag filter
/// selects: one page and the token of the next.
pub async fn describe_groups(
    client: &QueryClient,
    names: &[&str],
    tag: Option<(&str, &str)>,
    next: Option<&str>,
) -> Result<(Vec<Group>, Option<String>), CloudError> {
    let mut params = asg("DescribeAutoScalingGroups").list("AutoScalingGroupNames.member", names);
    if let Some((key, value)) = tag {
        params = params.structs(
            "Filters.member",
            &[vec![
                ("Name", format!("tag:{key}")),
                ("Values.member.1", value.into()),
            ]],
        );
    }
    let what = names.first().map_or("Auto Scaling groups".into(), |n| {
        format!("Auto Scaling group {n}")
    });
    let xml = client
        .call(Service::AutoScaling, params.maybe("NextToken", next), &what)
        .await?;
    let none = Xml::default();
    let result = xml.child("DescribeAutoScalingGroupsResult").unwrap_or(&none);
    let groups = result.items(&["AutoScalingGroups"]).map(group).collect();
    Ok((groups, result.text_at(&["NextToken"]).filter(|t| !t.is_empty())))
}

/// One group of a DescribeAutoScalingGroups answer.
pub fn group(xml: &Xml) -> Group {
    let text = |path: &[&str]| xml.text_at(path).unwrap_or_default();
    let spec = xml.at(&["LaunchTemplate"]).or_else(|| {
        xml.at(&[
            "MixedInstancesPolicy",
            "LaunchTemplate",
            "LaunchTemplateSpecification",
        ])
    });
    let name = text(&["AutoScalingGroupName"]);
    Group {
        desired_capacity: text(&["DesiredCapacity"]).parse().unwrap_or(0),
        template: spec.map(|s| TemplateRef {
            id: s.text_at(&["LaunchTemplateId"]),
            name: s.text_at(&["LaunchTemplateName"]),
            version: s.text_at(&["Version"]),
        }),
        instances: xml
            .items(&["Instances"])
            .map(|i| GroupInstance {
                id: i.text_at(&["InstanceId"]).unwrap_or_default(),
                group: name.clone(),
                zone: i.text_at(&["AvailabilityZone"]).unwrap_or_default(),
                lifecycle_state: i.text_at(&["LifecycleState"]).unwrap_or_default(),
            })
            .collect(),
        tags: tags(xml.items(&["Tags"]), "Key", "Value"),
        name,
    }
}

fn tags<'a>(items: impl Iterator<Item = &'a Xml>, key: &str, value: &str) -> Vec<(String, String)> {
    items
        .filter_map(|t| Some((t.text_at(&[key])?, t.text_at(&[value]).unwrap_or_default())))
        .collect()
}

/// DescribeAutoScalingInstances: the groups the instances are in (all
/// instances in groups when `ids` is empty).
pub async fn describe_group_instances(
    client: &QueryClient,
    ids: &[&str],
) -> Result<Vec<GroupInstance>, CloudError> {
    let params = asg("DescribeAutoScalingInstances").list("InstanceIds.member", ids);
    let what = ids
        .first()
        .map_or("instances".into(), |id| format!("instance {id}"));
    let xml = client.call(Service::AutoScaling, params, &what).await?;
    Ok(xml
        .items(&["DescribeAutoScalingInstancesResult", "AutoScalingInstances"])
        .map(|i| GroupInstance {
            id: i.text_at(&["InstanceId"]).unwrap_or_default(),
            group: i.text_at(&["AutoScalingGroupName"]).unwrap_or_default(),
            zone: i.text_at(&["AvailabilityZone"]).unwrap_or_default(),
            lifecycle_state: i.text_at(&["LifecycleState"]).unwrap_or_default(),
        })
        .collect())
}

/// SetDesiredCapacity, cooldown ignored.
pub async fn set_desired_capacity(client: &QueryClient, group: &str, desired: i32) -> Result<(), CloudError> {
    let params = asg("SetDesiredCapacity")
        .set("AutoScalingGroupName", group)
        .set("DesiredCapacity", desired.to_string())
        .set("HonorCooldown", "false");
    client
        .call(
            Service::AutoScaling,
            params,
            &format!("Auto Scaling group {group}"),
        )
        .await
        .map(drop)
}

/// TerminateInstanceInAutoScalingGroup, its group's desired capacity decremented.
pub async fn terminate_in_group(client: &QueryClient, instance: &str) -> Result<(), CloudError> {
    let params = asg("TerminateInstanceInAutoScalingGroup")
        .set("InstanceId", instance)
        .set("ShouldDecrementDesiredCapacity", "true");
    client
        .call(Service::AutoScaling, params, &format!("instance {instance}"))
        .await
        .map(drop)
}

/// CreateOrUpdateTags (Some value) or DeleteTags (None) of one group tag
/// propagated at launch.
pub async fn set_group_tag(
    client: &QueryClient,
    group: &str,
    key: &str,
    value: Option<&str>,
) -> Result<(), CloudError> {
    let action = if value.is_some() {
        "CreateOrUpdateTags"
    } else {
        "DeleteTags"
    };
    let tag = vec![
        ("ResourceId", group.to_string()),
        ("ResourceType", "auto-scaling-group".into()),
        ("Key", key.to_string()),
        ("Value", value.unwrap_or_default().to_string()),
        ("PropagateAtLaunch", "true".into()),
    ];
    let params = asg(action).structs("Tags.member", &[tag]);
    client
        .call(
            Service::AutoScaling,
            params,
            &format!("tags of Auto Scaling group {group}"),
        )
        .await
        .map(drop)
}

/// DescribeInstances of the given ids (all when empty), optionally only
/// those with a tag's value; every page.
pub async fn describe_instances(
    client: &QueryClient,
    ids: &[&str],
    tag: Option<(&str, &str)>,
) -> Result<Vec<Instance>, CloudError> {
    let what = ids
        .first()
        .map_or("instances".into(), |id| format!("instance {id}"));
    let mut out = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let mut params = ec2("DescribeInstances").list("InstanceId", ids);
        if let Some((key, value)) = tag {
            params = params.structs(
                "Filter",
                &[vec![("Name", format!("tag:{key}")), ("Value.1", value.into())]],
            );
        }
        let xml = client
            .call(Service::Ec2, params.maybe("NextToken", next.as_deref()), &what)
            .await?;
        out.extend(instances(&xml));
        next = xml.text_at(&["nextToken"]).filter(|t| !t.is_empty());
        if next.is_none() {
            return Ok(out);
        }
    }
}

/// The instances of a DescribeInstances answer.
pub fn instances(xml: &Xml) -> Vec<Instance> {
    xml.items(&["reservationSet"])
        .flat_map(|r| r.items(&["instancesSet"]))
        .map(|i| Instance {
            id: i.text_at(&["instanceId"]).unwrap_or_default(),
            image_id: i.text_at(&["imageId"]),
            private_dns_name: i.text_at(&["privateDnsName"]),
            zone: i.text_at(&["placement", "availabilityZone"]),
            state: i.text_at(&["instanceState", "name"]),
            tags: tags(i.items(&["tagSet"]), "key", "value"),
        })
        .collect()
}

/// DescribeInstanceStatus of one instance, stopped ones included: its state
/// name, None when EC2 has no status for it.
pub async fn instance_state(client: &QueryClient, id: &str) -> Result<Option<String>, CloudError> {
    let params = ec2("DescribeInstanceStatus")
        .list("InstanceId", [id])
        .set("IncludeAllInstances", "true");
    let xml = client
        .call(Service::Ec2, params, &format!("instance {id}"))
        .await?;
    Ok(xml
        .items(&["instanceStatusSet"])
        .find_map(|s| s.text_at(&["instanceState", "name"])))
}

/// CreateTags: one tag on one resource.
pub async fn tag_resource(
    client: &QueryClient,
    resource: &str,
    key: &str,
    value: &str,
) -> Result<(), CloudError> {
    let params = ec2("CreateTags")
        .list("ResourceId", [resource])
        .structs("Tag", &[vec![("Key", key.into()), ("Value", value.into())]]);
    client
        .call(Service::Ec2, params, &format!("instance {resource}"))
        .await
        .map(drop)
}

/// DescribeLaunchTemplateVersions: one version (a number, `$Default`, `$Latest`).
pub async fn template_versions(
    client: &QueryClient,
    template: &str,
    version: &str,
) -> Result<Vec<TemplateVersion>, CloudError> {
    let params = template_param(ec2("DescribeLaunchTemplateVersions"), template)
        .list("LaunchTemplateVersion", [version]);
    let xml = client
        .call(Service::Ec2, params, &format!("launch template {template}"))
        .await?;
    Ok(xml
        .items(&["launchTemplateVersionSet"])
        .map(template_version)
        .collect())
}

/// One version of a DescribeLaunchTemplateVersions answer.
pub fn template_version(xml: &Xml) -> TemplateVersion {
    let none = Xml::default();
    let data = xml.child("launchTemplateData").unwrap_or(&none);
    TemplateVersion {
        number: xml.text_at(&["versionNumber"]).and_then(|n| n.parse().ok()),
        data: TemplateData {
            image_id: data.text_at(&["imageId"]),
            instance_type: data.text_at(&["instanceType"]),
            key_name: data.text_at(&["keyName"]),
            user_data: data.text_at(&["userData"]),
            security_group_ids: data
                .items(&["securityGroupIdSet"])
                .map(|i| i.text.clone())
                .collect(),
            iam_profile_arn: data.text_at(&["iamInstanceProfile", "arn"]),
            iam_profile_name: data.text_at(&["iamInstanceProfile", "name"]),
        },
    }
}

/// CreateLaunchTemplateVersion from `source` with `data`: the new number.
pub async fn create_template_version(
    client: &QueryClient,
    template: &str,
    source: i64,
    data: &TemplateData,
    description: &str,
) -> Result<i64, CloudError> {
    let params = template_param(ec2("CreateLaunchTemplateVersion"), template)
        .set("SourceVersion", source.to_string())
        .set("VersionDescription", description);
    let params = template_data(params, "LaunchTemplateData", data);
    let what = format!("launch template {template}");
    let xml = client.call(Service::Ec2, params, &what).await?;
    xml.text_at(&["launchTemplateVersion", "versionNumber"])
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| CloudError::InvalidResponse(format!("{what}: a new version without a number")))
}

/// A launch template's data as request parameters under `prefix`.
pub fn template_data(params: Params, prefix: &str, data: &TemplateData) -> Params {
    let field = |name: &str| format!("{prefix}.{name}");
    params
        .maybe(&field("ImageId"), data.image_id.clone())
        .maybe(&field("InstanceType"), data.instance_type.clone())
        .maybe(&field("KeyName"), data.key_name.clone())
        .maybe(&field("UserData"), data.user_data.clone())
        .list(&field("SecurityGroupId"), &data.security_group_ids)
        .maybe(&field("IamInstanceProfile.Arn"), data.iam_profile_arn.clone())
        .maybe(&field("IamInstanceProfile.Name"), data.iam_profile_name.clone())
}

/// ModifyLaunchTemplate: makes `version` the default.
pub async fn set_default_version(
    client: &QueryClient,
    template: &str,
    version: i64,
) -> Result<(), CloudError> {
    let params =
        template_param(ec2("ModifyLaunchTemplate"), template).set("SetDefaultVersion", version.to_string());
    client
        .call(Service::Ec2, params, &format!("launch template {template}"))
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bodies botocore serializes for the same calls.
    #[test]
    fn requests_serialize_as_botocore_does() {
        let data = TemplateData {
            image_id: Some("ami-1".into()),
            instance_type: Some("t3.small".into()),
            key_name: Some("k".into()),
            user_data: Some("dQ==".into()),
            security_group_ids: vec!["sg-1".into(), "sg-2".into()],
            iam_profile_arn: Some("arn:x".into()),
            iam_profile_name: Some("n".into()),
        };
        let version = template_param(ec2("CreateLaunchTemplateVersion"), "lt-1")
            .set("SourceVersion", "3")
            .set("VersionDescription", "d");
        assert_eq!(
            template_data(version, "LaunchTemplateData", &data).body(),
            "Action=CreateLaunchTemplateVersion&Version=2016-11-15&LaunchTemplateId=lt-1&SourceVersion=3\
             &VersionDescription=d&LaunchTemplateData.ImageId=ami-1&LaunchTemplateData.InstanceType=t3.small\
             &LaunchTemplateData.KeyName=k&LaunchTemplateData.UserData=dQ%3D%3D\
             &LaunchTemplateData.SecurityGroupId.1=sg-1&LaunchTemplateData.SecurityGroupId.2=sg-2\
             &LaunchTemplateData.IamInstanceProfile.Arn=arn%3Ax&LaunchTemplateData.IamInstanceProfile.Name=n"
        );
        assert_eq!(
            template_param(ec2("ModifyLaunchTemplate"), "tpl")
                .set("SetDefaultVersion", "4")
                .body(),
            "Action=ModifyLaunchTemplate&Version=2016-11-15&LaunchTemplateName=tpl&SetDefaultVersion=4"
        );
        assert_eq!(
            template_param(ec2("DescribeLaunchTemplateVersions"), "lt-1")
                .list("LaunchTemplateVersion", ["$Default"])
                .body(),
            "Action=DescribeLaunchTemplateVersions&Version=2016-11-15&LaunchTemplateId=lt-1&LaunchTemplateVersion.1=%24Default"
        );
        let tag = vec![
            ("ResourceId", "g".to_string()),
            ("ResourceType", "auto-scaling-group".into()),
            ("Key", "k".into()),
            ("Value", "v".into()),
            ("PropagateAtLaunch", "true".into()),
        ];
        assert_eq!(
            asg("CreateOrUpdateTags").structs("Tags.member", &[tag]).body(),
            "Action=CreateOrUpdateTags&Version=2011-01-01&Tags.member.1.ResourceId=g\
             &Tags.member.1.ResourceType=auto-scaling-group&Tags.member.1.Key=k&Tags.member.1.Value=v\
             &Tags.member.1.PropagateAtLaunch=true"
        );
        assert_eq!(
            asg("DescribeAutoScalingInstances")
                .list("InstanceIds.member", ["i-1"])
                .body(),
            "Action=DescribeAutoScalingInstances&Version=2011-01-01&InstanceIds.member.1=i-1"
        );
    }

    #[test]
    fn groups_read_their_template_instances_and_tags() {
        let xml = Xml::parse(
            r#"<DescribeAutoScalingGroupsResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/">
            <DescribeAutoScalingGroupsResult><AutoScalingGroups><member>
              <AutoScalingGroupName>g</AutoScalingGroupName><DesiredCapacity>3</DesiredCapacity>
              <MixedInstancesPolicy><LaunchTemplate><LaunchTemplateSpecification>
                <LaunchTemplateId>lt-1</LaunchTemplateId><Version>$Default</Version>
              </LaunchTemplateSpecification></LaunchTemplate></MixedInstancesPolicy>
              <Instances><member><InstanceId>i-1</InstanceId><AvailabilityZone>eu-west-1a</AvailabilityZone>
                <LifecycleState>InService</LifecycleState></member></Instances>
              <Tags><member><Key>constellation-role</Key><Value>worker</Value></member></Tags>
            </member></AutoScalingGroups><NextToken>n2</NextToken></DescribeAutoScalingGroupsResult>
            </DescribeAutoScalingGroupsResponse>"#,
        )
        .expect("parses");
        let result = xml.child("DescribeAutoScalingGroupsResult").expect("a result");
        let g = group(result.items(&["AutoScalingGroups"]).next().expect("a group"));
        assert_eq!(g.desired_capacity, 3);
        assert_eq!(g.template.and_then(|t| t.id), Some("lt-1".into()));
        assert_eq!(g.instances[0].lifecycle_state, "InService");
        assert_eq!(g.instances[0].group, "g");
        assert_eq!(g.tags, [("constellation-role".to_string(), "worker".to_string())]);
    }

    #[test]
    fn template_versions_read_the_settings_they_copy() {
        let xml = Xml::parse(
            r#"<item><versionNumber>7</versionNumber><launchTemplateData><imageId>ami-2</imageId>
            <securityGroupIdSet><item>sg-1</item></securityGroupIdSet>
            <iamInstanceProfile><arn>arn:p</arn></iamInstanceProfile></launchTemplateData></item>"#,
        )
        .expect("parses");
        let v = template_version(&xml);
        assert_eq!(v.number, Some(7));
        assert_eq!(v.data.image_id.as_deref(), Some("ami-2"));
        assert_eq!(v.data.security_group_ids, ["sg-1"]);
        assert_eq!(
            (v.data.iam_profile_arn.as_deref(), v.data.iam_profile_name),
            (Some("arn:p"), None)
        );
    }
}
