//! A scale set's or VM's `imageReference` as nodewarden's image string, and
//! back, in the three forms a NodeVersion names Azure images by: an image
//! or gallery image version's ARM ID, a community gallery image
//! (`/communityGalleries/…`), a shared gallery image (`/sharedGalleries/…`),
//! or a marketplace image
//! (`constellation-marketplace-image://Azure?offer=…&publisher=…&sku=…&version=…`).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::super::form;

/// What a marketplace image string starts with.
pub const MARKETPLACE: &str = "constellation-marketplace-image://Azure?";

/// An `imageReference`: the fields nodewarden reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct ImageReference {
    /// A managed image's or a gallery image version's ARM ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// A community gallery image version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub community_gallery_image_id: Option<String>,
    /// A gallery image version shared directly with the subscription.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_gallery_image_id: Option<String>,
    /// A marketplace image's publisher.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publisher: Option<String>,
    /// A marketplace image's offer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offer: Option<String>,
    /// A marketplace image's SKU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sku: Option<String>,
    /// A marketplace image's version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl ImageReference {
    /// The image string; None when the reference names no image.
    pub fn image(&self) -> Option<String> {
        let some = |v: &Option<String>| v.as_deref().filter(|s| !s.is_empty()).map(str::to_string);
        if let Some(id) = some(&self.id) {
            return Some(id);
        }
        if let Some(id) =
            some(&self.community_gallery_image_id).or_else(|| some(&self.shared_gallery_image_id))
        {
            return Some(id);
        }
        let (publisher, offer, sku, version) = (
            some(&self.publisher)?,
            some(&self.offer)?,
            some(&self.sku)?,
            some(&self.version)?,
        );
        let query = form::encode(&[
            ("offer", &offer),
            ("publisher", &publisher),
            ("sku", &sku),
            ("version", &version),
        ]);
        Some(format!("{MARKETPLACE}{query}"))
    }
}

/// The `imageReference` that makes new VMs boot `image`.
pub fn reference_for(image: &str) -> Value {
    if let Some(query) = image.strip_prefix(MARKETPLACE) {
        let mut reference = json!({});
        for pair in query.split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_encoding::percent_decode_str(value).decode_utf8_lossy();
            if ["publisher", "offer", "sku", "version"].contains(&name) {
                reference[name] = json!(value);
            }
        }
        return reference;
    }
    let lower = image.to_ascii_lowercase();
    if lower.starts_with("/communitygalleries/") {
        return json!({"communityGalleryImageId": image});
    }
    if lower.starts_with("/sharedgalleries/") {
        return json!({"sharedGalleryImageId": image});
    }
    json!({"id": image})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_go_both_ways() {
        let gallery = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/Constellation/images/constellation/versions/2.24.0";
        let community = "/communityGalleries/ConstellationCVM-b3782fa0/images/constellation/versions/2.24.0";
        let shared = "/sharedGalleries/0000-1111.Constellation/images/constellation/versions/2.24.0";
        let marketplace = "constellation-marketplace-image://Azure?offer=constellation&publisher=edgelesssystems&sku=constellation&version=2.24.0";
        for image in [gallery, community, shared, marketplace] {
            let reference: ImageReference =
                serde_json::from_value(reference_for(image)).expect("a reference");
            assert_eq!(reference.image().as_deref(), Some(image));
        }
        assert_eq!(
            reference_for(community),
            json!({"communityGalleryImageId": community})
        );
        assert_eq!(
            reference_for(marketplace),
            json!({"offer": "constellation", "publisher": "edgelesssystems", "sku": "constellation", "version": "2.24.0"})
        );
        let partial = ImageReference {
            publisher: Some("p".into()),
            ..Default::default()
        };
        assert_eq!(partial.image(), None);
    }
}
